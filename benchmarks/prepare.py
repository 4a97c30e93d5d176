"""Export each workload once: the forward ONNX model, the initial weights and the batches.

For a workload ``w`` the folder ``<workdir>/<w.name>/`` receives

- ``model.onnx``: ``torch.onnx.export`` (TorchScript exporter, training mode, no
  constant folding, opset 17), with the IR version lowered to what
  onnxruntime-training 1.19.2 loads (<= 10);
- ``weights.npz``: the torch state dict (PyTorch's starting point; the
  ONNX initializers hold the same values);
- ``data.npz``: ``x`` and ``y``, ``[batches, batch, ...]`` (the workload's ``data_batches``);
- ``spec.json``: what the workers need (:class:`Spec`), readable without torch or onnx.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.workloads import ADAMW, STEP_BATCHES, Workload

#: ONNX Runtime 1.19.2 loads IR version <= 10 and opsets <= 21.
MAX_IR_VERSION = 10
MAX_OPSET = 21
OPSET = 17
#: Batches cycled through by the timed steps of the per-step workloads.
BATCHES = STEP_BATCHES


@dataclass
class Spec:
    """A prepared workload, as ``spec.json`` holds it."""

    name: str
    title: str
    loss: str
    optimizer: str
    learning_rate: float
    input_name: str
    output_name: str
    requires_grad: list[str]
    adamw: dict[str, object] = field(default_factory=dict)
    batches: int = BATCHES
    epoch: bool = False  # onnxtrain times whole passes (Module.train_epoch) over the batches

    @classmethod
    def load(cls, folder: Path) -> Spec:
        return cls(**json.loads((folder / "spec.json").read_text()))


def export_for_training(
    model: Any,
    args: tuple[Any, ...],
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict[str, dict[int, str]] | None = None,
) -> None:
    """``torch.onnx.export`` as the benchmarks export: TorchScript's exporter in training mode, no constant
    folding, opset :data:`OPSET`, into ``path``."""
    import torch

    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notices: chosen on purpose
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            args,
            str(path),
            dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            opset_version=OPSET,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
        )


def prepare(workload: Workload, workdir: Path) -> Path:
    """Write the workload's files into ``workdir/<name>`` (again, if present) and return that folder."""
    import onnx
    import torch

    folder = workdir / workload.name
    folder.mkdir(parents=True, exist_ok=True)
    model = workload.build()
    model.train()
    example = torch.zeros((workload.batch, *workload.input_shape))
    with torch.no_grad():
        output_shape = tuple(model(example).shape)
    x, y = workload.batches(workload.data_batches, output_shape)
    path = folder / "model.onnx"
    export_for_training(model, (example,), path, ["input"], ["output"])
    proto = onnx.load(str(path))
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    opsets = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    if opsets.get("ai.onnx", 0) > MAX_OPSET:
        raise ValueError(f"{workload.name}: opset {opsets} is newer than onnxruntime-training 1.19.2 loads")
    onnx.save(proto, str(path))

    parameters = dict(model.named_parameters())
    initializers = [t.name for t in proto.graph.initializer]
    missing = sorted(set(parameters) - set(initializers))
    if missing:
        raise ValueError(f"{workload.name}: the exported model lost the parameters {missing}; it has {initializers}")
    np.savez(folder / "weights.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    np.savez(folder / "data.npz", x=x, y=y)
    spec = Spec(
        name=workload.name,
        title=workload.title,
        loss=workload.loss,
        optimizer=workload.optimizer,
        learning_rate=workload.learning_rate,
        input_name=proto.graph.input[0].name,
        output_name=proto.graph.output[0].name,
        requires_grad=[name for name in initializers if name in parameters],
        adamw={"betas": list(ADAMW["betas"]), "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"]},
        batches=workload.data_batches,
        epoch=workload.epoch,
    )
    (folder / "spec.json").write_text(json.dumps(asdict(spec), indent=1))
    return folder
