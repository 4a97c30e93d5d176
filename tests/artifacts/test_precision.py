"""Mixed precision: ``generate_artifacts(..., precision="bf16" | "fp16")`` and the autocast policy.

The promise: the forward computes in the half type exactly where the policy
(updated by the user's overrides) says, the interface and the parameters stay
float32, gradients agree with float32's within the half type's tolerance,
training reaches float32's loss, and an execution provider without a half
kernel runs that operator in float32, with a warning that names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from onnxtrain import api
from onnxtrain.artifacts import LossType, OptimType, build_artifacts
from onnxtrain.artifacts.export import export_model_for_inferencing
from onnxtrain.artifacts.metadata import PRECISION_KEY, read_metadata
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes.autocast import (
    FLOAT32_OPERATORS,
    HALF_OPERATORS,
    PRECISIONS,
    autocast,
    schema_takes,
)
from onnxtrain.graph.roles import trainable_parameters
from onnxtrain.optim.loss_scaling import LOSS_SCALE
from onnxtrain.training import half_kernels
from onnxtrain.training.models import LoadedModel
from tests.helpers import export_for_training
from tests.transformers import models as zoo

HALF = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}
#: Gradient tolerance, relative to each gradient's largest magnitude: a few units of the type's last place
#: through a dozen layers of products.
GRADIENT_TOLERANCE = {"fp16": 1e-2, "bf16": 6e-2}


def _torch_models() -> dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]]:
    """Exports of common layers (and a batch for each): a CNN, an LSTM tagger, the transformer zoo."""

    def cnn() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10),
        )  # fmt: skip
        x = np.random.default_rng(0).normal(size=(6, 1, 8, 8)).astype(np.float32)
        model = export_for_training(
            net, (torch.from_numpy(x),), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}
        )
        return model, {"x": x, "labels": np.arange(6, dtype=np.int64) % 10}

    def lstm() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)

        class Tagger(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lstm = torch.nn.LSTM(5, 12, batch_first=True)
                self.head = torch.nn.Linear(12, 4)

            def forward(self, x: object) -> object:
                return self.head(self.lstm(x)[0][:, -1])

        x = np.random.default_rng(1).normal(size=(3, 7, 5)).astype(np.float32)
        model = export_for_training(
            Tagger(), (torch.from_numpy(x),), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}
        )
        return model, {"x": x, "labels": np.array([0, 3, 1], np.int64)}

    def gelu_mlp() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        """torch's tanh GELU, which autocast computes in part in the half type (``x * x * x``, then a cast)."""
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(16, 4))
        x = np.random.default_rng(3).normal(size=(5, 6)).astype(np.float32)
        model = export_for_training(
            net, (torch.from_numpy(x),), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}
        )
        return model, {"x": x, "labels": np.array([0, 3, 1, 2, 2], np.int64)}

    def transformer(name: str) -> Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
        def make() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
            data = zoo.batch(name, np.random.default_rng(2), 5)
            return zoo.exported(name).model, {"ids": data["ids"], "labels": data["labels"]}

        return make

    return {"cnn": cnn, "lstm": lstm, "gelu_mlp": gelu_mlp, **{name: transformer(name) for name in zoo.NAMES}}


MODELS = _torch_models()


def _data_inputs(node: onnx.NodeProto, opset: int) -> list[int]:
    """The positions of ``node``'s inputs of the type variable of its output 0 (its data, not its options)."""
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    variable = schema.outputs[0].type_str
    formal = [schema.inputs[min(k, len(schema.inputs) - 1)].type_str for k in range(len(node.input))]
    return [k for k, name in enumerate(node.input) if name and formal[k] == variable]


def _elem(types: GraphBuilder, name: str) -> int | None:
    type_proto = types.type_of(name) if types.has(name) else None
    return type_proto.tensor_type.elem_type if type_proto is not None and type_proto.HasField("tensor_type") else None


@pytest.mark.parametrize("precision", sorted(HALF))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_forward_computes_in_half_where_the_policy_says(name: str, precision: str):
    model, _ = MODELS[name]()
    half = HALF[precision]
    opset = GraphBuilder(model).opset
    original = {node.name: node for node in model.graph.node}
    cast, report = autocast(copy_model(model), half)
    onnx.checker.check_model(cast, full_check=True)
    types = GraphBuilder(cast)
    placed = {}
    for node in cast.graph.node:
        if node.name not in report:
            continue
        floats = {_elem(types, node.input[k]) for k in _data_inputs(node, opset)}
        placed[node.name] = node.op_type
        assert floats == ({half} if report[node.name] == "half" else {onnx.TensorProto.FLOAT}), node.name
        takes = schema_takes(original[node.name], opset, half)
        if node.op_type in HALF_OPERATORS:
            assert report[node.name] == ("half" if takes else "float32"), node.name
        if node.op_type in FLOAT32_OPERATORS:
            assert report[node.name] == "float32", node.name
    assert placed.keys() == report.keys()  # every node with a float data input is placed, and only those
    assert "half" in report.values()
    # the interface and the parameters are those of the float32 model
    for before, after in ((model.graph.input, cast.graph.input), (model.graph.output, cast.graph.output)):
        assert [v.SerializeToString() for v in before] == [v.SerializeToString() for v in after]
    assert [t.data_type for t in cast.graph.initializer] == [t.data_type for t in model.graph.initializer]


def _run(model: onnx.ModelProto, data: dict[str, np.ndarray], precision: str) -> tuple[float, dict[str, np.ndarray]]:
    """The loss and every parameter's gradient of one train step of artifacts of ``precision``."""
    parameters = trainable_parameters(model)
    built = build_artifacts(model, requires_grad=parameters, loss=LossType.CrossEntropyLoss, precision=precision)
    state = api.CheckpointState(built.checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", half_kernels.HalfPrecisionFallbackWarning)
        module = api.Module(built.training_model, state, built.eval_model)
        loss = float(module(*data.values()))
    scale = state.parameters[LOSS_SCALE].data[0] if LOSS_SCALE in built.checkpoint.frozen else 1.0
    return loss, {name: state.parameters[name].grad / scale for name in parameters}  # fp16's are scaled


@pytest.mark.parametrize("precision", sorted(HALF))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_gradient_agrees_with_float32_within_the_half_tolerance(name: str, precision: str):
    model, data = MODELS[name]()
    want_loss, want = _run(model, data, "fp32")
    loss, grads = _run(model, data, precision)
    tolerance = GRADIENT_TOLERANCE[precision]
    assert loss == pytest.approx(want_loss, rel=tolerance)
    assert grads.keys() == want.keys()
    largest = max(float(np.abs(g).max()) for g in want.values())
    for param, grad in grads.items():
        assert grad.dtype == np.float32, f"{param}: the gradient of a float32 master weight is float32"
        # a gradient zero in exact arithmetic (a key bias, under softmax) is rounding noise of the whole backward
        scale = max(float(np.abs(want[param]).max()), 1e-3 * largest)
        np.testing.assert_allclose(grad, want[param], rtol=0, atol=tolerance * scale, err_msg=param)


@pytest.mark.parametrize("precision", ["fp32", *sorted(HALF)])
def test_a_gelu_chain_split_by_casts_is_differentiated_as_one_function(precision: str):
    """In half precision torch's tanh GELU computes ``x^3`` in the half type between two casts: the chain, casts
    included, is still the GELU, whose derivative reads none of its links (node by node it read the ``Tanh``)."""
    model, _ = MODELS["gelu_mlp"]()
    built = build_artifacts(
        model, requires_grad=trainable_parameters(model), loss=LossType.CrossEntropyLoss, precision=precision
    )
    forward = {name for node in model.graph.node for name in node.output}
    tanh = {node.output[0] for node in model.graph.node if node.op_type == "Tanh"}
    backward = [node for node in built.training_model.graph.node if not set(node.output) & forward]
    assert tanh and not [node.op_type for node in backward if set(node.input) & tanh]
    assert any(node.op_type == "Sigmoid" for node in backward)


def test_a_user_override_moves_an_operator():
    model, _ = MODELS["cnn"]()
    _, default = autocast(copy_model(model), HALF["fp16"])
    _, moved = autocast(copy_model(model), HALF["fp16"], {"Conv": "float32", "Relu": "half"})
    assert {k: v for k, v in default.items() if k.startswith("/0/") or "Conv" in k}
    assert all(mode == "float32" for key, mode in moved.items() if "Conv" in key)
    assert any(mode == "half" for key, mode in moved.items() if "Relu" in key)


def test_bad_precisions_and_overrides_are_refused_before_anything_is_built():
    model, _ = MODELS["cnn"]()
    with pytest.raises(ValueError, match=r"precision='fp8' is not known; choose one of \['fp32', 'bf16', 'fp16'\]"):
        build_artifacts(model, requires_grad=[], precision="fp8")
    with pytest.raises(ValueError, match="precision_overrides maps operator types to 'half' or 'float32'"):
        build_artifacts(model, requires_grad=[], precision="bf16", precision_overrides={"Conv": "int8"})
    with pytest.raises(ValueError, match="need target='onnxruntime'"):
        build_artifacts(model, requires_grad=[], precision="bf16", target="onnxruntime-training")
    assert set(PRECISIONS) == {"fp32", "bf16", "fp16"}


def test_a_missing_half_kernel_runs_its_operator_in_float32_with_a_warning_naming_it():
    model, data = MODELS["cnn"]()
    built = build_artifacts(model, requires_grad=[], loss=LossType.CrossEntropyLoss, precision="fp16")
    loaded = LoadedModel(built.eval_model, built.eval_model.SerializeToString())
    tried: list[LoadedModel] = []

    def make(candidate: LoadedModel) -> ort.InferenceSession:
        """A provider without a float16 Conv: refuses any graph with a Conv reading float16."""
        tried.append(candidate)
        types = GraphBuilder(candidate.proto)
        for node in candidate.proto.graph.node:
            if node.op_type == "Conv" and _elem(types, node.input[0]) == onnx.TensorProto.FLOAT16:
                raise ort_errors.NotImplemented(
                    f"[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Conv(11) "
                    f"node with name '{node.name}'"
                )
        return ort.InferenceSession(candidate.source, providers=["CPUExecutionProvider"])

    with pytest.warns(half_kernels.HalfPrecisionFallbackWarning, match="the eval model computes Conv in a half type"):
        session = half_kernels.open_session(loaded, "eval model", make)
    assert len(tried) == 2
    state = built.checkpoint  # the parameters are inputs of the eval model
    inputs = {"x": data["x"], "labels": data["labels"], **{k: np.asarray(v) for k, v in state.trainable.items()}}
    inputs.update({k: np.asarray(v) for k, v in state.frozen.items()})
    wanted = {i.name for i in session.get_inputs()}
    loss = session.run(None, {k: v for k, v in inputs.items() if k in wanted})[0]
    assert np.isfinite(loss)


def test_a_kernel_missing_for_another_reason_is_raised_as_it_is():
    model, _ = MODELS["cnn"]()
    built = build_artifacts(model, requires_grad=[], loss=LossType.CrossEntropyLoss)  # float32: nothing to widen
    loaded = LoadedModel(built.eval_model, built.eval_model.SerializeToString())

    def make(candidate: LoadedModel) -> ort.InferenceSession:
        raise ort_errors.NotImplemented("Could not find an implementation for Conv(11) node with name 'c'")

    with pytest.raises(ort_errors.NotImplemented, match="Conv"):
        half_kernels.open_session(loaded, "eval model", make)


def _digits() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    torch = pytest.importorskip("torch")
    sklearn = pytest.importorskip("sklearn.datasets")
    digits = sklearn.load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    model = export_for_training(
        net, (torch.from_numpy(x[:4]),), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}
    )
    return model, x, y


def _train(model: onnx.ModelProto, batches: list[tuple[np.ndarray, np.ndarray]], precision: str) -> float:
    """The mean loss of the last 20 of ``len(batches)`` AdamW steps."""
    parameters = trainable_parameters(model)
    built = build_artifacts(
        model, requires_grad=parameters, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW, precision=precision
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", half_kernels.HalfPrecisionFallbackWarning)
        module = api.Module(built.training_model, api.CheckpointState(built.checkpoint), built.eval_model)
        optimizer = api.Optimizer(built.optimizer_model, module)
        optimizer.set_learning_rate(3e-3)
        losses = []
        for x, y in batches:
            losses.append(float(module(x, y)))
            optimizer.step()
            module.lazy_reset_grad()
    return float(np.mean(losses[-20:]))


@pytest.mark.parametrize("precision", sorted(HALF))
def test_200_steps_of_the_digits_mlp_reach_float32s_loss(precision: str):
    model, x, y = _digits()
    rng = np.random.default_rng(0)
    batches = [(x[i], y[i]) for i in (rng.choice(len(x), 32, replace=False) for _ in range(200))]
    want = _train(model, batches, "fp32")
    assert want < 0.5  # it learned
    assert _train(model, batches, precision) == pytest.approx(want, rel=0.02)


@pytest.mark.parametrize("precision", sorted(HALF))
def test_200_steps_of_a_small_transformer_reach_float32s_loss(precision: str):
    model = zoo.exported("bert").model
    fixed = [zoo.batch("bert", np.random.default_rng(k), 6, size=4) for k in range(4)]
    batches = [(fixed[k % 4]["ids"], fixed[k % 4]["labels"]) for k in range(200)]
    want = _train(model, batches, "fp32")
    assert want < 0.5  # it learned the four batches
    assert _train(model, batches, precision) == pytest.approx(want, rel=0.02, abs=0.01)


def _exported(model: onnx.ModelProto, precision: str, export_as: str | None) -> onnx.ModelProto:
    built = build_artifacts(
        model, requires_grad=trainable_parameters(model), loss=LossType.CrossEntropyLoss, precision=precision
    )
    state = built.checkpoint
    return export_model_for_inferencing(built.eval_model, state, ["y"], precision=export_as)


def _half_casts(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "Cast" and n.attribute[0].i in HALF.values()]


@pytest.mark.parametrize("name", ["cnn", "lstm", "gpt2"])
def test_an_export_in_float32_computes_as_float32_artifacts_do(name: str):
    model, data = MODELS[name]()
    feeds = {k: v for k, v in data.items() if k != "labels"}
    want = ort.InferenceSession(
        _exported(model, "fp32", None).SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)[0]
    exported = _exported(model, "bf16", "fp32")
    onnx.checker.check_model(exported, full_check=True)
    assert not _half_casts(exported)
    floating = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, *HALF.values()}
    assert {t.data_type for t in exported.graph.initializer} & floating <= {onnx.TensorProto.FLOAT}
    got = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", sorted(HALF))
def test_an_export_in_a_half_type_stores_the_products_weights_in_it(precision: str):
    model, data = MODELS["cnn"]()
    exported = _exported(model, "fp32", precision)
    onnx.checker.check_model(exported, full_check=True)
    types = {t.name: t.data_type for t in exported.graph.initializer}
    readers = {name: node for node in exported.graph.node for name in node.input}
    products = [name for name, node in readers.items() if node.op_type in ("Gemm", "MatMul") and name in types]
    assert products and all(types[name] == HALF[precision] for name in products)
    assert read_metadata(exported)[PRECISION_KEY] == precision
    float32 = _exported(model, "fp32", None)
    sizes = {t.name: onnx.numpy_helper.to_array(t).nbytes for t in exported.graph.initializer}
    wide = {t.name: onnx.numpy_helper.to_array(t).nbytes for t in float32.graph.initializer}
    assert sum(sizes.values()) < sum(wide.values())
    # each stored under its cast's output, "<weight>.float16" or "<weight>.bfloat16", at half the float32 bytes
    assert all(sizes[name] * 2 == wide[name.rsplit(".", 1)[0]] for name in products)
    if precision == "fp16":  # onnxruntime's CPU provider loads float16 models (runs their products in float32)
        feeds = {"x": data["x"]}
        want = ort.InferenceSession(float32.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=0, atol=1e-2 * np.abs(want).max())


@pytest.mark.parametrize("export_as", [None, "bf16", "fp32", "fp16"])
def test_an_export_the_modules_provider_cannot_run_says_so(export_as: str | None, tmp_path) -> None:
    """A module whose provider lacks a bfloat16 kernel runs those nodes in float32; an export computing in the
    eval model's bfloat16 keeps them, and is said to need another provider, exactly when this provider cannot
    load it (onnxruntime's CPU provider has bfloat16 kernels for almost no operator)."""
    model, _, _ = _digits()
    built = build_artifacts(model, requires_grad=trainable_parameters(model), precision="bf16",
                            loss=LossType.CrossEntropyLoss)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", half_kernels.HalfPrecisionFallbackWarning)
        module = api.Module(built.training_model, api.CheckpointState(built.checkpoint), built.eval_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module.export_model_for_inferencing(tmp_path / "m.onnx", ["y"], precision=export_as)
    said = [w for w in caught if "the exported model computes" in str(w.message)]
    try:
        ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
        loads = True
    except ort_errors.NotImplemented:
        loads = False
    assert len(said) == int(not loads)
    if said:
        assert said[0].category is half_kernels.HalfPrecisionFallbackWarning
        assert "in bf16" in str(said[0].message) and "precision='fp32'" in str(said[0].message)
    if export_as in ("fp32", "fp16"):
        assert loads


def test_a_modules_sessions_name_each_operator_run_in_float32_once() -> None:
    """bfloat16 on the CPU: every session of the module (training, reset, fused, eval) widens the same operators;
    one warning names several of them, and no operator is named twice."""
    model, x, y = _digits()
    built = build_artifacts(model, requires_grad=trainable_parameters(model), precision="bf16",
                            loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = api.Module(built.training_model, api.CheckpointState(built.checkpoint), built.eval_model)
        optimizer = api.Optimizer(built.optimizer_model, module)
        for _ in range(2):
            module(x[:32], y[:32])
            optimizer.step()
            module.lazy_reset_grad()
        module.eval()(x[:32], y[:32])
    said = [str(w.message) for w in caught if w.category is half_kernels.HalfPrecisionFallbackWarning]
    named = [op for message in said for op in message.split(" computes ")[1].split(" in a half type")[0].split(", ")]
    assert said and len(named) == len(set(named)) and len(named) > len(said), said
