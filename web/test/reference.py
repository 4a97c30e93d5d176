"""Python's side of the JavaScript tests: artifacts, batches and the Python runtime's numbers, made at test time.

Run by web/test/*.test.js with the Python that has onnxtrain (``ONNXTRAIN_PYTHON``)::

    python reference.py prepare OUT          # artifacts of the digits MLP and a small CNN, batches, Python's runs
    python reference.py resume CASE CKPT START STEPS OUT   # Python resumes a checkpoint (saved by JavaScript)
    python reference.py demo ASSETS STEPS OUT   # Python's first STEPS steps of the demo page (demo/make_assets.py)

``prepare`` writes, per case (``OUT/mlp``, ``OUT/cnn``): ``model.onnx``; the
artifacts by ``onnxtrain generate`` in ``artifacts/``; ``batches/<input>.bin``
(every step's batch, little-endian, concatenated) and ``case.json`` describing
them; Python's run of ``STEPS`` steps of ``module(*batch); optimizer.step();
module.lazy_reset_grad()``: the losses and ``params.bin`` (float32, the
contiguous parameters in training-model order before the first step and after
each); the checkpoint Python saves (with optimizer state) after ``SAVE_AT``
steps, ``python-<SAVE_AT>.ckpt``. For the MLP also a run that accumulates two
micro-batches per optimizer step (``accumulate``). Nothing is committed: the
numbers come from the onnxtrain being tested.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STEPS = 20
SAVE_AT = 10
BATCH = 32
LEARNING_RATE = 0.01
SEED = 0
TYPES = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64"}


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits: pixels float32 [N, 64] in [0, 1], labels int64 [N]."""
    from onnxtrain.cli.digits import load

    return load()


def mlp_model() -> onnx.ModelProto:
    """The demo's 64-64-10 MLP (``onnxtrain demo``'s), weights drawn with seed 0."""
    from onnxtrain.cli.digits import forward_model

    return forward_model(SEED)


def cnn_model() -> onnx.ModelProto:
    """images [batch, 1, 8, 8] -> Conv 4x3x3 -> BatchNormalization (training mode) -> Relu -> MaxPool 2x2 ->
    Flatten -> Gemm -> 10 scores. The convolution has no bias: BatchNormalization would remove it, leaving it a
    gradient of rounding errors that AdamW would scale up to whole steps. Its attributes are all explicit, as
    torch.onnx.export writes them: onnxruntime-web 1.30's WebGPU Conv fails ("dilations should be 2D") on a
    Conv without ``dilations`` whose weight is an input, as a parameter of a training model is."""
    rng = np.random.default_rng(SEED)

    def init(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    initializers = [
        init("conv.weight", (4, 1, 3, 3), 0.3),
        numpy_helper.from_array(np.ones(4, np.float32), "bn.weight"),
        numpy_helper.from_array(np.zeros(4, np.float32), "bn.bias"),
        numpy_helper.from_array(np.zeros(4, np.float32), "bn.running_mean"),
        numpy_helper.from_array(np.ones(4, np.float32), "bn.running_var"),
        init("fc.weight", (64, 10), 0.15),
        init("fc.bias", (10,), 0.05),
    ]
    nodes = [
        helper.make_node(  # every attribute explicit, as torch.onnx.export writes them (see cnn_model's docstring)
            "Conv",
            ["images", "conv.weight"],
            ["conv"],
            pads=[1, 1, 1, 1],
            strides=[1, 1],
            dilations=[1, 1],
            kernel_shape=[3, 3],
            group=1,
        ),
        helper.make_node(
            "BatchNormalization",
            ["conv", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            ["bn"],
            momentum=0.9,
            training_mode=1,
        ),
        helper.make_node("Relu", ["bn"], ["relu"]),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 10])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def generate(model: onnx.ModelProto, case_dir: Path) -> Path:
    """``onnxtrain generate`` (cross-entropy, AdamW, the learning rate in the checkpoint) into ``artifacts/``."""
    path = case_dir / "model.onnx"
    onnx.save(model, path)
    out = case_dir / "artifacts"
    command = [sys.executable, "-m", "onnxtrain", "generate", str(path), "--requires-grad", "weights"]
    command += ["--loss", "ce", "--optimizer", "adamw", "--lr", str(LEARNING_RATE), "-o", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return out


def batches(case: str, steps: int) -> list[list[np.ndarray]]:
    """``steps`` batches of ``BATCH`` digits, drawn with seed 0: ``[pixels or images, labels]``."""
    pixels, labels = digits()
    order = np.random.default_rng(SEED).permutation(len(pixels))[: steps * BATCH].reshape(steps, BATCH)
    if case == "cnn":
        pixels = pixels.reshape(-1, 1, 8, 8)
    return [[pixels[rows], labels[rows]] for rows in order]


def open_module(artifacts: Path, checkpoint: Path):
    """``(state, module, optimizer)`` of onnxtrain's ORT-style API, at the test's learning rate."""
    from onnxtrain.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(str(checkpoint))
    module = Module(str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"))
    optimizer = Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(LEARNING_RATE)
    return state, module, optimizer


def parameters(module) -> np.ndarray:
    return module.get_contiguous_parameters(trainable_only=False).numpy().astype(np.float32)


def run(artifacts: Path, checkpoint: Path, steps: list[list[np.ndarray]], save: Path | None = None) -> dict:
    """Train on ``steps`` (each a list of micro-batches: one train step each, then one optimizer step).

    Returns the losses (one per train step), the parameters before and after
    each optimizer step, and the eval model's loss on the first batch at the
    end; with ``save``, saves the checkpoint after ``SAVE_AT`` steps.
    """
    from onnxtrain.api import CheckpointState

    state, module, optimizer = open_module(artifacts, checkpoint)
    losses, params = [], [parameters(module)]
    for index, micro_batches in enumerate(steps):
        for batch in micro_batches:
            loss = module(*batch)
            losses.append(float(np.asarray(loss[0] if isinstance(loss, tuple) else loss)))
        optimizer.step()
        module.lazy_reset_grad()
        params.append(parameters(module))
        if save is not None and index + 1 == SAVE_AT:
            CheckpointState.save_checkpoint(state, str(save), include_optimizer_state=True)
    module.eval()
    evaluated = module(*steps[0][0])
    eval_loss = float(np.asarray(evaluated[0] if isinstance(evaluated, tuple) else evaluated))
    return {"losses": losses, "params": np.stack(params), "eval_loss": eval_loss}


def write_run(result: dict, case_dir: Path, name: str) -> None:
    result["params"].astype("<f4").tofile(case_dir / f"{name}-params.bin")
    (case_dir / f"{name}.json").write_text(json.dumps({"losses": result["losses"], "evalLoss": result["eval_loss"]}))


def prepare_case(case: str, model: onnx.ModelProto, out: Path) -> None:
    case_dir = out / case
    (case_dir / "batches").mkdir(parents=True, exist_ok=True)
    artifacts = generate(model, case_dir)
    data = batches(case, STEPS)
    names = [value.name for value in onnx.load(artifacts / "training_model.onnx").graph.input][: len(data[0])]
    inputs = []
    for i, name in enumerate(names):
        stacked = np.stack([batch[i] for batch in data])
        stacked.astype(stacked.dtype.newbyteorder("<")).tofile(case_dir / "batches" / f"{name}.bin")
        inputs.append({"name": name, "type": TYPES[stacked.dtype], "dims": list(stacked.shape[1:])})
    manifest = {"steps": STEPS, "saveAt": SAVE_AT, "learningRate": LEARNING_RATE, "inputs": inputs}
    (case_dir / "case.json").write_text(json.dumps(manifest, indent=1))
    write_run(run(artifacts, artifacts / "checkpoint", [[b] for b in data], case_dir / f"python-{SAVE_AT}.ckpt"),
              case_dir, "python")  # fmt: skip
    if case == "mlp":  # the same model's artifacts with dynamic loss scaling (float32, so the numbers are exact)
        from onnxtrain import artifacts as onnxtrain_artifacts

        onnxtrain_artifacts.generate_artifacts(
            str(case_dir / "model.onnx"), requires_grad=onnxtrain_artifacts.trainable_parameters(model),
            loss="CrossEntropyLoss", optimizer="AdamW", artifact_directory=str(case_dir / "artifacts-scaled"),
            loss_scaling=True,
        )  # fmt: skip
    if case == "mlp":  # two micro-batches per optimizer step: gradient accumulation
        pairs = [[data[2 * k], data[2 * k + 1]] for k in range(STEPS // 2)]
        write_run(run(artifacts, artifacts / "checkpoint", pairs), case_dir, "accumulate")
        write_checkpoint_variants(case_dir / f"python-{SAVE_AT}.ckpt", case_dir)


def write_checkpoint_variants(source: Path, case_dir: Path) -> None:
    """The checkpoint ``source`` as Python also writes it: nominal (``python-nominal.ckpt``), with its tensors in an
    external data file (``python-external.ckpt`` and ``.data``), with properties of every kind
    (``python-properties.ckpt``), and the runtime's state saved without its optimizer state
    (``python-dropped.ckpt``, which records the step count it was dropped at)."""
    from dataclasses import replace

    from onnxtrain import checkpoint as ckpt
    from onnxtrain.training import TrainingState

    state = ckpt.load(str(source))
    dropped = TrainingState(state).to_checkpoint(include_optimizer_state=False)
    ckpt.save(dropped, str(case_dir / "python-dropped.ckpt"))
    ckpt.save(state.nominal(), str(case_dir / "python-nominal.ckpt"))
    ckpt.save(state, str(case_dir / "python-external.ckpt"), external_data_threshold=1024)
    properties = {"epoch": 3, "best": 0.25, "negative zero": -0.0, "run": "\u03b1", "big": -(2**62)}
    ckpt.save(replace(state, properties=properties), str(case_dir / "python-properties.ckpt"))


def resume(case_dir: Path, checkpoint: Path, start: int, steps: int, out: Path) -> None:
    """Load ``checkpoint`` (with optimizer state), save it again (``out.resaved``), train ``steps`` steps from
    batch ``start``; write the losses and parameters as ``prepare`` does (``out.json``, ``out-params.bin``)."""
    from onnxtrain import checkpoint as ckpt

    ckpt.save(ckpt.load(str(checkpoint)), str(out.parent / f"{out.name}.resaved"))
    case = json.loads((case_dir / "case.json").read_text())
    data = batches("cnn" if case["inputs"][0]["name"] == "images" else "mlp", case["steps"])
    result = run(case_dir / "artifacts", checkpoint, [[b] for b in data[start : start + steps]])
    write_run(result, out.parent, out.name)


def demo(assets: Path, steps: int, out: Path) -> None:
    """The demo page's first ``steps`` steps, in Python: batches of ``batchSize`` rows of ``digits.bin`` in
    file order, at the learning rate the checkpoint stores (``onnxtrain generate --lr``)."""
    from onnxtrain import checkpoint as ckpt

    manifest = json.loads((assets / "digits.json").read_text())
    count, features, size = manifest["count"], manifest["features"], manifest["batchSize"]
    raw = (assets / "digits.bin").read_bytes()
    pixels = np.frombuffer(raw, "<f4", count * features).reshape(count, features)
    labels = np.frombuffer(raw, np.uint8, count, offset=4 * count * features).astype(np.int64)
    if steps * size > manifest["train"]:
        sys.exit(f"{steps} steps of {size} rows run past the {manifest['train']} training rows")
    rate = ckpt.load(str(assets / "artifacts" / "checkpoint")).properties["onnxtrain.learning_rate"]
    if rate != np.float32(LEARNING_RATE):
        sys.exit(f"the demo's checkpoint stores the learning rate {rate}, not {LEARNING_RATE}")
    data = [[[pixels[k * size : (k + 1) * size], labels[k * size : (k + 1) * size]]] for k in range(steps)]
    write_run(run(assets / "artifacts", assets / "artifacts" / "checkpoint", data), out.parent, out.name)


def main(argv: list[str]) -> None:
    if argv[:1] == ["prepare"] and len(argv) == 2:
        out = Path(argv[1])
        prepare_case("mlp", mlp_model(), out)
        prepare_case("cnn", cnn_model(), out)
    elif argv[:1] == ["resume"] and len(argv) == 6:
        resume(Path(argv[1]), Path(argv[2]), int(argv[3]), int(argv[4]), Path(argv[5]))
    elif argv[:1] == ["demo"] and len(argv) == 4:
        demo(Path(argv[1]), int(argv[2]), Path(argv[3]))
    else:
        sys.exit(
            f"usage: {Path(__file__).name} prepare OUT | resume CASE_DIR CKPT START STEPS OUT | demo ASSETS STEPS OUT"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
