"""Dimensions named by onnxruntime's symbolic shape inference (onnxtrain.graph.symbolic), and the gradients built
with them: the sums over broadcast axes are decided when the gradient is built, and the gradients equal those
decided at run time, at every batch and sequence length, 1 included (where a broadcast could have hidden)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.artifacts import generate
from onnxtrain.graph import symbolic
from onnxtrain.graph.io import inferred_skeleton

pytest.importorskip("sympy")

FEATURES, HEADS = 8, 2


def attention_model() -> onnx.ModelProto:
    """Two attention heads as an export writes them: the heads by ``Reshape`` to ``[batch, seq, -1, 4]`` computed
    from ``Shape(x)``, a causal mask made from a ``Range`` of ``Shape(x)[1]`` positions and added to the scores:
    onnx's inference names neither the heads nor the mask's sizes."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(size=(FEATURES, FEATURES)).astype(np.float32) * 0.3, name)
        for name in ("Wq", "Wk", "Wv")
    ]
    constants = [
        numpy_helper.from_array(np.array(0, np.int64), "start"),
        numpy_helper.from_array(np.array(1, np.int64), "delta"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "hidden"),
        numpy_helper.from_array(np.array(0, np.float32), "shown"),
        numpy_helper.from_array(np.array([-1, FEATURES // HEADS], np.int64), "per_head"),
        numpy_helper.from_array(np.array([-1], np.int64), "rest"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "one", "two"], ["seq"]),
        helper.make_node("Slice", ["x_shape", "zero", "two"], ["batch_seq"]),
        helper.make_node("Concat", ["batch_seq", "per_head"], ["heads"], axis=0),
        helper.make_node("Concat", ["batch_seq", "rest"], ["merged"], axis=0),
        helper.make_node("Squeeze", ["seq"], ["length"]),
        helper.make_node("Range", ["start", "length", "delta"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "one"], ["rows"]),
        helper.make_node("Unsqueeze", ["positions", "zero"], ["columns"]),
        helper.make_node("Greater", ["columns", "rows"], ["future"]),
        helper.make_node("Where", ["future", "hidden", "shown"], ["mask"]),
    ]
    for name in ("q", "k", "v"):
        nodes += [
            helper.make_node("MatMul", ["x", f"W{name}"], [f"{name}_flat"]),
            helper.make_node("Reshape", [f"{name}_flat", "heads"], [f"{name}_split"]),
            helper.make_node("Transpose", [f"{name}_split"], [name], perm=[0, 2, 1, 3]),
        ]
    nodes += [
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
        helper.make_node("Add", ["scores", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["heads_out"]),
        helper.make_node("Transpose", ["heads_out"], ["joined"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["joined", "merged"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", FEATURES])],
        weights + constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _dims(graph: onnx.GraphProto, name: str) -> list[int | str | None]:
    for value in graph.value_info:
        if value.name == name:
            return [
                d.dim_value if d.HasField("dim_value") else d.dim_param or None
                for d in value.type.tensor_type.shape.dim
            ]
    raise KeyError(name)


def test_the_dimensions_onnx_leaves_unknown_get_names():
    model = attention_model()
    plain = inferred_skeleton(model).graph
    # onnx's inference: the heads' count and the mask's sizes unknown, or fresh names (unk__N) nothing else has
    assert _dims(plain, "q_split")[2] != HEADS and not set(_dims(plain, "mask")) & {"seq"}
    named = symbolic.with_symbolic_dims(attention_model())
    inferred = inferred_skeleton(named).graph  # onnx's own inference keeps them
    assert _dims(inferred, "q_split") == ["batch", "seq", HEADS, FEATURES // HEADS]
    assert _dims(inferred, "mask") == ["seq", "seq"]
    assert _dims(inferred, "scores") == _dims(inferred, "masked") == ["batch", HEADS, "seq", "seq"]
    # the graph's inputs and outputs are the user's declarations: untouched
    assert [i.SerializeToString() for i in named.graph.input] == [i.SerializeToString() for i in model.graph.input]
    assert [o.SerializeToString() for o in named.graph.output] == [o.SerializeToString() for o in model.graph.output]


def test_known_dimensions_stay_and_unknown_ones_are_filled():
    model = attention_model()
    model.graph.value_info.extend(
        [
            helper.make_tensor_value_info("q_split", TensorProto.FLOAT, ["b", None, None, 4]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, None),
        ]
    )
    symbolic.with_symbolic_dims(model)
    assert _dims(model.graph, "q_split") == ["b", "seq", HEADS, 4]  # the declared name kept, the rest filled
    assert _dims(model.graph, "mask") == ["seq", "seq"]
    assert len({v.name for v in model.graph.value_info}) == len(model.graph.value_info)  # nothing listed twice


def test_a_model_the_inference_cannot_read_is_left_as_it_is():
    node = helper.make_node("Mystery", ["x"], ["y"], domain="example.custom")
    graph = helper.make_graph(
        [node, helper.make_node("Relu", ["y"], ["z"])],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    )
    before = model.SerializeToString()
    assert symbolic.with_symbolic_dims(model).SerializeToString() == before


def test_without_sympy_nothing_is_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "onnxruntime.tools.symbolic_shape_infer", None)  # its import fails
    assert symbolic.symbolic_value_info(attention_model()) == []
    model = attention_model()
    assert symbolic.with_symbolic_dims(model).SerializeToString() == attention_model().SerializeToString()


def _both_ways(folder: Path, precision: str = "fp32") -> dict[str, Path]:
    """The attention model's artifacts in ``precision`` with the symbolic dimensions, and without them (the sums
    over broadcast axes decided at run time)."""
    onnx.save(attention_model(), folder / "model.onnx")
    made = {}
    for way in ("named", "run time"):
        target = folder / way.replace(" ", "-")
        with pytest.MonkeyPatch.context() as patch:
            if way == "run time":
                patch.setattr(generate, "with_symbolic_dims", lambda model: model)
            artifacts.generate_artifacts(
                str(folder / "model.onnx"),
                requires_grad=["Wq", "Wk", "Wv"],
                loss=artifacts.LossType.MSELoss,
                optimizer=artifacts.OptimType.AdamW,
                artifact_directory=target,
                precision=precision,
            )
        made[way] = target
    return made


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _both_ways(tmp_path_factory.mktemp("attention"))


def _op_count(directory: Path, op: str) -> int:
    model = onnx.load(str(directory / "training_model.onnx"))
    return sum(node.op_type == op for node in model.graph.node)


def test_with_the_names_no_sum_is_decided_at_run_time(both_ways):
    assert _op_count(both_ways["run time"], "NonZero") > 0  # the batched products' and the mask's
    assert _op_count(both_ways["named"], "NonZero") == 0


def _gradients(directory: Path, x: np.ndarray, target: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    loss = float(module(x, target))
    return loss, {name: np.array(parameter.grad) for name, parameter in state.parameters}


@settings(max_examples=12, deadline=None)
@given(batch=st.sampled_from([1, 2, 3]), seq=st.sampled_from([1, 2, 5, 16]), seed=st.integers(0, 2**16))
def test_the_gradients_equal_those_decided_at_run_time(both_ways, batch, seq, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, seq, FEATURES)).astype(np.float32)
    target = rng.normal(size=(batch, seq, FEATURES)).astype(np.float32)
    loss, grads = _gradients(both_ways["named"], x, target)
    reference_loss, reference = _gradients(both_ways["run time"], x, target)
    assert loss == pytest.approx(reference_loss, rel=1e-6)
    assert set(grads) == {"Wq", "Wk", "Wv"}
    for name, grad in grads.items():
        assert grad.shape == (FEATURES, FEATURES)
        np.testing.assert_allclose(grad, reference[name], rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_in_half_precision_the_names_hold_through_the_casts(tmp_path: Path, precision: str) -> None:
    """Autocast runs the reshapes and products in half on copies of the values: the copies keep the names of
    the sizes (``autocast.declare_like``), so no sum is decided at run time there either, and the gradients are
    those decided at run time, to half precision's rounding (the products sum in another order)."""
    made = _both_ways(tmp_path, precision)
    assert _op_count(made["run time"], "NonZero") > 0
    assert _op_count(made["named"], "NonZero") == 0
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, FEATURES)).astype(np.float32)
    target = rng.normal(size=(2, 5, FEATURES)).astype(np.float32)
    loss, grads = _gradients(made["named"], x, target)
    reference_loss, reference = _gradients(made["run time"], x, target)
    assert loss == pytest.approx(reference_loss, rel=1e-6)
    assert set(grads) >= {"Wq", "Wk", "Wv"}
    for name in ("Wq", "Wk", "Wv"):
        scale = np.abs(reference[name]).max()
        np.testing.assert_allclose(grads[name], reference[name], rtol=0, atol=2e-3 * scale, err_msg=name)


def test_a_broadcast_the_inference_cannot_name_is_not_reported_to_the_user(capfd: pytest.CaptureFixture[str]):
    """A position table sliced to at most its 16 rows (``Min(16, seq)``) added to the ``seq`` rows of the input:
    onnxruntime's tool warns on its logger, which Python prints to stderr where the user configured no logging."""
    table = numpy_helper.from_array(np.zeros((16, 4), np.float32), "table")
    constants = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("one", 1), ("two", 2))]
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "one", "two"], ["seq"]),
        helper.make_node("Slice", ["table", "zero", "seq"], ["rows"]),
        helper.make_node("Add", ["x", "rows"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "positions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [table, *constants],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    symbolic.symbolic_value_info(model)
    assert "unsupported broadcast" not in capfd.readouterr().err
    assert logging.getLogger(symbolic._TOOL_LOGGER).level == logging.NOTSET  # the tool's own level given back


def decoder_model() -> onnx.ModelProto:
    """A decoder as torch exports it: the image halved (a 3x3 convolution of stride 2), upsampled by 2 three ways
    (``Resize`` by scales: bilinear, bilinear with aligned corners, nearest) and each cropped back to the input's
    size (``u[..., :H, :W]``: a ``Slice`` of the rows up to ``Shape(x)[2]``, then of the columns), concatenated
    with a 1x1 convolution of the input. At odd ``h`` the upsampled image has ``h + 1`` rows
    (``2*floor(h/2 - 1/2) + 2``), which the tool cannot compare with ``h`` and takes as equal."""
    rng = np.random.default_rng(1)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.normal(size=shape) * 0.3).astype(np.float32), name)

    parameters = [
        weight("down_w", 4, 3, 3, 3),
        weight("down_b", 4),
        weight("skip_w", 4, 3, 1, 1),
        weight("skip_b", 4),
        weight("head_w", 4, 16, 1, 1),
        weight("head_b", 4),
    ]
    constants = [
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        *(
            numpy_helper.from_array(np.array([v], np.int64), name)
            for v, name in [(0, "zero"), (2, "two"), (3, "three"), (4, "four")]
        ),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "down_w", "down_b"], ["down"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["down"], ["features"]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "two", "three"], ["height"]),
        helper.make_node("Slice", ["x_shape", "three", "four"], ["width"]),
        helper.make_node("Conv", ["x", "skip_w", "skip_b"], ["skip"]),
    ]
    modes = [
        {"mode": "linear"},
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        {"mode": "nearest"},
    ]
    for i, mode in enumerate(modes):
        nodes += [
            helper.make_node("Resize", ["features", "", "scales"], [f"upsampled{i}"], **mode),
            helper.make_node("Slice", [f"upsampled{i}", "zero", "height", "two"], [f"rows{i}"]),
            helper.make_node("Slice", [f"rows{i}", "zero", "width", "three"], [f"cropped{i}"]),
        ]
    nodes += [
        helper.make_node("Concat", ["skip", "cropped0", "cropped1", "cropped2"], ["joined"], axis=1),
        helper.make_node("Conv", ["joined", "head_w", "head_b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "h", "w"])],
        parameters + constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # opset 17's: what every supported onnxruntime loads (onnx's default may be newer)
    return model


#: The values the tool sizes by its guess, and those computed from them.
GUESSED = ("rows0", "cropped0", "rows1", "cropped1", "rows2", "cropped2", "joined")


def _declared(values: list[onnx.ValueInfoProto]) -> dict[str, list[int | str]]:
    return {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in values}


def test_a_size_the_inference_guesses_is_not_declared(capfd: pytest.CaptureFixture[str]):
    """The tool takes the crop's end ``h`` as equal to the upsampled ``2*floor(h/2 - 1/2) + 2`` rows (a guess,
    which it warns of): neither the crop nor what is computed from it is declared; what precedes it is, with
    the batch named ``n`` (the tool writes ``floor(1.0*n)``, ``n`` times the scale 1.0)."""
    declared = _declared(symbolic.symbolic_value_info(decoder_model()))
    assert set(GUESSED).isdisjoint(declared)
    upsampled = ["n", 4, "2*floor(h/2 - 1/2) + 2", "2*floor(w/2 - 1/2) + 2"]
    assert declared["upsampled0"] == declared["upsampled1"] == declared["upsampled2"] == upsampled
    assert declared["down"] == declared["features"] == ["n", 4, "floor(h/2 - 1/2) + 1", "floor(w/2 - 1/2) + 1"]
    assert declared["skip"] == ["n", 4, "h", "w"]
    assert "treat as equal" not in capfd.readouterr().err  # the guess held back from the user, as before
    model = symbolic.with_symbolic_dims(decoder_model())
    assert set(GUESSED).isdisjoint(_declared(list(model.graph.value_info)))


def test_where_the_tool_warnings_cannot_be_seen_nothing_is_declared():
    """``logging.disable`` hides the tool's warnings, and with them its guesses: nothing it inferred is kept."""
    logging.disable(logging.WARNING)
    try:
        assert symbolic.symbolic_value_info(decoder_model()) == []
    finally:
        logging.disable(logging.NOTSET)
    assert symbolic.symbolic_value_info(attention_model())  # the names back once the warnings can be seen


def _run(model: onnx.ModelProto | str, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("height, width", [(37, 53), (38, 54), (1, 1)])
def test_the_decoder_trains_evaluates_and_exports_at_any_size(tmp_path: Path, height: int, width: int):
    """The eval step and the exported model run at odd sizes too, where the guessed size is one row and one
    column too many (onnxruntime failed: ``Shape mismatch attempting to re-use buffer``), and give the
    original model's output."""
    onnx.save(decoder_model(), tmp_path / "model.onnx")
    paths = artifacts.generate_artifacts(
        str(tmp_path / "model.onnx"),
        requires_grad=["down_w", "down_b", "skip_w", "skip_b", "head_w", "head_b"],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD,
        artifact_directory=tmp_path / "artifacts",
    )
    for key in ("training_model", "eval_model"):  # the crop's rows and columns unknown (unk__N) or h and w
        declared = _declared(list(onnx.load(str(paths[key])).graph.value_info))
        for name in GUESSED:
            assert not any("floor" in str(dim) for dim in declared.get(name, [])), (key, name, declared[name])
    rng = np.random.default_rng(height)
    x = rng.normal(size=(2, 3, height, width)).astype(np.float32)
    target = np.zeros((2, 4, height, width), np.float32)
    expected = _run(decoder_model(), x)
    state = api.CheckpointState.load_checkpoint(str(paths["checkpoint"]))
    module = api.Module(str(paths["training_model"]), state, str(paths["eval_model"]))
    train_loss = float(module(x, target))
    assert train_loss == pytest.approx(float(np.mean(expected**2)), rel=1e-5)
    module.eval()
    assert float(module(x, target)) == pytest.approx(train_loss, rel=1e-6)
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["y"])
    np.testing.assert_allclose(_run(str(tmp_path / "inference.onnx"), x), expected, rtol=1e-5, atol=1e-6)
