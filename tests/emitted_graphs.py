"""Fingerprints of the models onnxtrain emits for a set of reference models: what a restructuring must not change.

``python -m tests.emitted_graphs`` writes ``tests/emitted_graphs.json`` for the
installed onnx (whose shape inference fills the value types the models carry);
``tests/test_emitted_graphs.py`` checks the models against it. A change to
what onnxtrain emits on purpose is recorded by writing the file again.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

RECORD = Path(__file__).with_name("emitted_graphs.json")


def fingerprint(model: onnx.ModelProto) -> str:
    """SHA-256 of the model's deterministic serialization (nodes, names, types, initializers, metadata)."""
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()[:16]


def _artifacts(name: str, optimizer: str, *, target: str = "onnxruntime") -> dict[str, onnx.ModelProto]:
    from onnxtrain import artifacts, optim
    from tests.autodiff import models

    case = models.build(name)
    loss = artifacts.LossType.CrossEntropyLoss if case.loss == "cross_entropy" else artifacts.LossType.MSELoss
    chosen = {
        "adamw": optim.AdamW(weight_decay=0.01),
        "sgd": optim.SGD(momentum=0.9, clip_grad=optim.ClipGradNorm(1.0)),
    }
    built = artifacts.build_artifacts(
        case.model, list(case.trainable), list(case.frozen), loss, chosen[optimizer], target=target
    )
    models_built = built.models()
    if target == "onnxruntime":
        trainable = list(case.trainable)
        models_built["reset_step"] = artifacts.remove_gradient_accumulation(built.training_model, trainable).model
        fused = artifacts.fuse_update_and_train(built.training_model, models_built["optimizer_model"], trainable)
        models_built["fused_step"] = fused.model
    return models_built


def _derivatives() -> dict[str, onnx.ModelProto]:
    from onnxtrain import autodiff
    from tests.autodiff import models

    case = models.build("mlp", np.float64)
    forward = models.forward_with_loss(case.model, case.loss)
    loss = forward.graph.output[0].name
    fixed = onnx.ModelProto()
    fixed.CopyFrom(case.model)
    for value in (*fixed.graph.input, *fixed.graph.output):  # a Jacobian needs every size: a batch of 2
        value.type.tensor_type.shape.dim[0].dim_value = 2
    return {
        "hvp": autodiff.hessian_vector_product(forward, loss, list(case.trainable)[:2]),
        "jacobian": autodiff.jacobian(fixed, "y", case.trainable[0]),
    }


def _adapted() -> dict[str, onnx.ModelProto]:
    from onnxtrain import artifacts
    from onnxtrain.lora import add_adapters
    from tests.autodiff import models

    case = models.build("transformer")
    targets = ["qkv.weight", "proj.weight"]
    adapted, names = add_adapters(case.model, targets, rank=2, alpha=4.0)
    built = artifacts.build_artifacts(adapted, names, [], artifacts.LossType.MSELoss, artifacts.OptimType.AdamW)
    return {"adapted": adapted, **built.models()}


#: ``{case: () -> {model name: model}}``: the reference builds.
CASES: dict[str, Callable[[], dict[str, onnx.ModelProto]]] = {
    "mlp-adamw": lambda: _artifacts("mlp", "adamw"),
    "cnn-sgd-clip": lambda: _artifacts("cnn", "sgd"),
    "transformer-adamw": lambda: _artifacts("transformer", "adamw"),
    "elementwise-sgd-clip": lambda: _artifacts("elementwise", "sgd"),
    "mlp-ort-training": lambda: _artifacts("mlp", "adamw", target="onnxruntime-training"),
    "derivatives": _derivatives,
    "lora-transformer": _adapted,
}


def fingerprints() -> dict[str, dict[str, str]]:
    """``{case: {model: fingerprint}}`` of every reference build."""
    return {case: {name: fingerprint(model) for name, model in build().items()} for case, build in CASES.items()}


def main() -> None:
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    recorded[onnx.__version__] = fingerprints()
    RECORD.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote the fingerprints for onnx {onnx.__version__} to {RECORD}\n")


if __name__ == "__main__":
    main()
