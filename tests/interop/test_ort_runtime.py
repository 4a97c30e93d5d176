"""Artifacts written with ``target="onnxruntime-training"`` train the same in ONNX Runtime's runtime and in onnxtrain's.

ONNX Runtime's side (1.19.2, ``ort_runtime_side.py``) runs in the
onnxruntime-training environment in one subprocess; onnxtrain's runs here on
stock onnxruntime, which has no ``com.microsoft`` training kernels: it reads
them as their standard-operator equivalents. From the same checkpoint and
data, ten steps give the same losses (relative 1e-5) and the same final
parameters, for every loss and each optimizer ONNX Runtime's runtime has, on
a small MLP; the same for a torch-exported LayerNorm MLP (which ONNX
Runtime's own generator cannot differentiate), for a nominal checkpoint
filled from a buffer, and for ``export_model_for_inferencing``. With AdamW
and SGD, half the steps in one runtime, saved with the optimizer state, and
the other half in the other give the same as all in ONNX Runtime. Skipped,
saying why, where the environment cannot be created (``make ort-training``).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, checkpoint, optim
from onnxtrain.artifacts import LossType, generate_artifacts
from tests.ort_training_env import ort_training_python, run_ort_side

STEPS = 10
LEARNING_RATE = 0.05
OPTIMIZERS = {"AdamW": lambda: optim.AdamW(weight_decay=0.01), "SGD": lambda: optim.SGD()}
FLOAT = onnx.TensorProto.FLOAT


@dataclass(frozen=True)
class Case:
    name: str
    loss: LossType
    optimizer: str
    model: str = "mlp"  # or "layernorm" (torch-exported)
    nominal: bool = False
    export: tuple[str, ...] = ()
    resume: bool = False  # also resumed half-way, each runtime from the other's checkpoint with optimizer state


CASES = [
    Case(f"{loss.name}-{opt}", loss, opt, resume=loss is LossType.MSELoss) for loss in LossType for opt in OPTIMIZERS
]
CASES += [
    Case("layernorm-AdamW", LossType.CrossEntropyLoss, "AdamW", model="layernorm"),
    Case("nominal-AdamW", LossType.MSELoss, "AdamW", nominal=True),
    Case("export-SGD", LossType.MSELoss, "SGD", export=("y",)),
]


def mlp(sigmoid: bool) -> onnx.ModelProto:
    """``y = relu(x W1 + b1) W2 + b2`` (then a sigmoid for losses that take probabilities), float32."""
    rng = np.random.default_rng(0)
    inits = {
        "W1": rng.normal(size=(4, 8)) / 2, "b1": rng.normal(size=8) / 10,
        "W2": rng.normal(size=(8, 3)) / 3, "b2": rng.normal(size=3) / 10,
    }  # fmt: skip
    last = "z" if sigmoid else "y"
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z0"]),
        helper.make_node("Add", ["z0", "b2"], [last]),
    ]
    if sigmoid:
        nodes.append(helper.make_node("Sigmoid", ["z"], ["y"]))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", FLOAT, ["batch", 3])],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def layernorm_mlp() -> onnx.ModelProto:
    """Linear, LayerNorm, Tanh, Linear, exported by torch (LayerNormalization with one output)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )  # fmt: skip
    buffer = io.BytesIO()
    torch.onnx.export(
        net, (torch.zeros(2, 4),), buffer, input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    return onnx.load_from_string(buffer.getvalue())


def batches(loss: LossType, seed: int) -> list[list[np.ndarray]]:
    """``STEPS`` batches of ``[x, labels or target]`` valid for ``loss``."""
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(STEPS):
        x = rng.normal(size=(6, 4)).astype(np.float32)
        if loss in (LossType.CrossEntropyLoss, LossType.NLLLoss):
            target = rng.integers(0, 3, size=6).astype(np.int64)
        elif loss is LossType.KLDivLoss:
            t = rng.uniform(0.1, 1.0, size=(6, 3))
            target = (t / t.sum(axis=1, keepdims=True)).astype(np.float32)
        else:
            low = 0.0 if loss in (LossType.BCELoss, LossType.BCEWithLogitsLoss) else -1.0
            target = rng.uniform(low, 1.0, size=(6, 3)).astype(np.float32)
        result.append([x, target])
    return result


def base_model(case: Case) -> onnx.ModelProto:
    if case.model == "layernorm":
        return layernorm_mlp()
    return mlp(sigmoid=case.loss is LossType.BCELoss)


def write_case(work: Path, case: Case, seed: int) -> dict:
    """Generate the case's artifacts and data in ``work/<name>``; return its entry of spec.json."""
    folder = work / case.name
    model = base_model(case)
    trainable = [t.name for t in model.graph.initializer if t.data_type == FLOAT]
    generate_artifacts(
        model, requires_grad=trainable, loss=case.loss, optimizer=OPTIMIZERS[case.optimizer](),
        artifact_directory=folder, nominal_checkpoint=case.nominal, target="onnxruntime-training",
    )  # fmt: skip
    steps = batches(case.loss, seed)
    np.savez(folder / "data.npz", **{f"s{t}_{k}": a for t, inputs in enumerate(steps) for k, a in enumerate(inputs)})
    if case.nominal:
        full = checkpoint.load(folder / "checkpoint")
        np.save(folder / "buffer.npy", np.concatenate([full.trainable[n].ravel() for n in trainable]))
    if case.resume:
        state = api.CheckpointState.load_checkpoint(folder / "checkpoint")
        onnxtrain_steps(folder, state, steps[: STEPS // 2])
        api.CheckpointState.save_checkpoint(state, folder / "onnxtrain_half", include_optimizer_state=True)
    return {
        "name": case.name, "steps": STEPS, "num_inputs": 2, "learning_rate": LEARNING_RATE,
        "nominal": case.nominal, "export": list(case.export), "resume": case.resume,
    }  # fmt: skip


@pytest.fixture(scope="module")
def ort_trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case generated by onnxtrain and trained by ONNX Runtime's runtime, in one subprocess."""
    ort_training_python()
    work = tmp_path_factory.mktemp("ort_runtime")
    entries = []
    for seed, case in enumerate(CASES):
        try:
            entries.append(write_case(work, case, seed))
        except pytest.skip.Exception:  # the torch-exported model without torch
            continue
    (work / "spec.json").write_text(json.dumps({"cases": entries}))
    run_ort_side(Path(__file__).with_name("ort_runtime_side.py"), work)
    return work


def onnxtrain_steps(
    folder: Path, state: api.CheckpointState, steps: list[list[np.ndarray]], buffer: np.ndarray | None = None
) -> tuple[list[float], api.Module]:
    """``steps`` with onnxtrain's runtime on the case's artifacts from ``state`` (filled from ``buffer`` if
    given): the losses and the module."""
    module = api.Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    if buffer is not None:
        module.copy_buffer_to_parameters(buffer, trainable_only=False)
    optimizer = api.Optimizer(folder / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(LEARNING_RATE)
    losses = []
    for inputs in steps:
        losses.append(float(module(*inputs)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses, module


def case_steps(folder: Path) -> list[list[np.ndarray]]:
    data = np.load(folder / "data.npz", allow_pickle=False)
    return [[data[f"s{t}_{k}"] for k in range(2)] for t in range(STEPS)]


def train_with_onnxtrain(folder: Path, case: Case) -> tuple[list[float], float, api.CheckpointState, api.Module]:
    """The same steps with onnxtrain's runtime on the same artifacts: losses, eval loss, state, module."""
    steps = case_steps(folder)
    state = api.CheckpointState.load_checkpoint(folder / ("nominal_checkpoint" if case.nominal else "checkpoint"))
    losses, module = onnxtrain_steps(folder, state, steps, np.load(folder / "buffer.npy") if case.nominal else None)
    module.eval()
    eval_loss = float(module(*steps[-1]))
    return losses, eval_loss, state, module


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_both_runtimes_train_the_artifacts_alike(ort_trained: Path, case: Case) -> None:
    folder = ort_trained / case.name
    if not (folder / "ort_report.json").exists():
        pytest.skip(f"{case.name}: its base model needs torch to be exported")
    report = json.loads((folder / "ort_report.json").read_text())
    losses, eval_loss, state, _ = train_with_onnxtrain(folder, case)
    np.testing.assert_allclose(losses, report["losses"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(eval_loss, report["eval_loss"], rtol=1e-5, atol=1e-7)
    assert losses[-1] != losses[0], "training changed nothing"
    ort_final = checkpoint.load(folder / "ort_final")
    assert sorted(ort_final.trainable) == sorted(checkpoint.load(folder / "checkpoint").trainable)
    for name, value in ort_final.trainable.items():
        np.testing.assert_allclose(state.parameters[name].data, value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_nominal_checkpoint_filled_from_a_buffer_trains_as_the_full_one(ort_trained: Path) -> None:
    nominal = json.loads((ort_trained / "nominal-AdamW" / "ort_report.json").read_text())
    full = json.loads((ort_trained / "MSELoss-AdamW" / "ort_report.json").read_text())
    # the same model and optimizer, other data: the first loss differs, but both start from the same weights
    start = checkpoint.load(ort_trained / "MSELoss-AdamW" / "checkpoint").trainable
    filled, _, _, _ = train_with_onnxtrain(ort_trained / "nominal-AdamW", CASES[-2])
    np.testing.assert_allclose(filled, nominal["losses"], rtol=1e-5)
    assert nominal["losses"] != full["losses"]
    assert checkpoint.load(ort_trained / "nominal-AdamW" / "nominal_checkpoint").is_nominal
    buffer = np.load(ort_trained / "nominal-AdamW" / "buffer.npy")
    np.testing.assert_array_equal(buffer, np.concatenate([start[n].ravel() for n in ("W1", "b1", "W2", "b2")]))


def test_ort_exports_our_eval_model_for_inference(ort_trained: Path) -> None:
    folder = ort_trained / "export-SGD"
    _, _, _, module = train_with_onnxtrain(folder, CASES[-1])
    ours = folder / "our_inference.onnx"
    module.export_model_for_inferencing(ours, ["y"])
    x = np.random.default_rng(5).normal(size=(7, 4)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(ours)).run(None, {"x": x})
    exported = onnx.load(folder / "ort_inference.onnx")
    assert [o.name for o in exported.graph.output] == ["y"]
    (actual,) = ort.InferenceSession(str(folder / "ort_inference.onnx")).run(None, {"x": x})
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c.resume], ids=lambda case: case.name)
def test_each_runtime_resumes_the_others_checkpoint_with_optimizer_state(ort_trained: Path, case: Case) -> None:
    """Half the steps in one runtime, saved with the optimizer state, the other half in the other: as the ten
    steps in ONNX Runtime alone (moments and step count carried over, both ways)."""
    folder = ort_trained / case.name
    report = json.loads((folder / "ort_report.json").read_text())
    steps = case_steps(folder)
    ort_final = checkpoint.load(folder / "ort_final")
    # ONNX Runtime's checkpoint of the first half, resumed by onnxtrain
    ort_half = checkpoint.load(folder / "ort_half")
    assert ort_half.optimizer is not None and ort_half.optimizer.step == STEPS // 2
    state = api.CheckpointState.load_checkpoint(folder / "ort_half")
    losses, _ = onnxtrain_steps(folder, state, steps[STEPS // 2 :])
    np.testing.assert_allclose(losses, report["losses"][STEPS // 2 :], rtol=1e-5, atol=1e-7)
    for name, value in ort_final.trainable.items():
        np.testing.assert_allclose(state.parameters[name].data, value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert state.step == STEPS
    # ... and by onnxtrain's own artifacts of the same model (ONNX Runtime's unread SGD momentum0 is dropped)
    native = folder / "native"
    model = base_model(case)
    generate_artifacts(
        model, requires_grad=[t.name for t in model.graph.initializer], loss=case.loss,
        optimizer=OPTIMIZERS[case.optimizer](), artifact_directory=native,
    )  # fmt: skip
    state = api.CheckpointState.load_checkpoint(folder / "ort_half")
    losses, _ = onnxtrain_steps(native, state, steps[STEPS // 2 :])
    np.testing.assert_allclose(losses, report["losses"][STEPS // 2 :], rtol=1e-5, atol=1e-7)
    for name, value in ort_final.trainable.items():
        np.testing.assert_allclose(state.parameters[name].data, value, rtol=1e-5, atol=1e-6, err_msg=name)
    # onnxtrain's checkpoint of the first half, resumed by ONNX Runtime
    np.testing.assert_allclose(report["resumed_losses"], report["losses"][STEPS // 2 :], rtol=1e-5, atol=1e-7)
    resumed = checkpoint.load(folder / "ort_resumed")
    assert resumed.optimizer is not None and resumed.optimizer.step == STEPS
    for name, value in ort_final.trainable.items():
        np.testing.assert_allclose(resumed.trainable[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
