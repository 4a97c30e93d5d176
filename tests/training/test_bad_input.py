"""Bad input: errors name the input and what was expected, raised before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain import api, checkpoint
from tests.training.helpers import classifier_batch, open_module, parameters, regression_batch


@pytest.fixture
def trained(regression, rng):
    """A module after one train step, and that step's gradient of fc0.weight."""
    state, module, optimizer = open_module(regression)
    module(*regression_batch(rng))
    return state, module, optimizer, state.parameters["fc0.weight"].grad


CASES = [
    # (args, kwargs, error, message)
    ((), {}, TypeError, r"missing input 'x' \(float32\[batch, 4\]\), 'target' \(float32\[batch, 3\]\)"),
    (("x",), {}, TypeError, r"missing input 'target' \(float32\[batch, 3\]\)"),
    (
        ("x", "t", "t"),
        {},
        TypeError,
        r"takes 2 user input\(s\) \(x: float32\[batch, 4\], target: float32\[batch, 3\]\); got 3",
    ),
    (("x",), {"targets": "t"}, TypeError, r"no input 'targets'; its user inputs are \['x', 'target'\]"),
    (("x", "t"), {"x": "x"}, TypeError, r"'x' .* given twice"),
    (("x64", "t"), {}, TypeError, r"input 'x' of the training model is float32\[batch, 4\]; got float64\[8, 4\]: cast"),
    (("x1d", "t"), {}, ValueError, r"input 'x' of the training model is float32\[batch, 4\]; got float32\[32\]"),
    (("x5", "t"), {}, ValueError, r"input 'x' .* float32\[batch, 4\]; got float32\[8, 5\]"),
    (("x", "t3"), {}, ValueError, r"input 'target' .* has batch = 3, but input 'x' has batch = 8"),
    (("list", "t"), {}, TypeError, r"input 'x' .* numpy.ndarray or an onnxruntime.OrtValue .*not list: convert"),
    (("array_like", "t"), {}, TypeError, r"not ArrayLike: convert it with numpy.asarray\(value\)"),
]


class ArrayLike:
    """An array of another library: NumPy can read it (``__array__``), onnxtrain takes NumPy arrays only."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.values


@pytest.mark.parametrize(("args", "kwargs", "error", "message"), CASES)
def test_bad_user_inputs_are_named_and_change_nothing(trained, rng, args, kwargs, error, message):
    state, module, _optimizer, grad = trained
    x, t = regression_batch(rng)
    values = {
        "x": x,
        "t": t,
        "x64": x.astype(np.float64),
        "x1d": x.ravel(),
        "x5": np.zeros((8, 5), np.float32),
        "t3": t[:3],
        "list": x.tolist(),
        "array_like": ArrayLike(x),
    }
    before = parameters(state)
    with pytest.raises(error, match=message):
        module(*[values[a] for a in args], **{k: values[v] for k, v in kwargs.items()})
    np.testing.assert_array_equal(state.parameters["fc0.weight"].grad, grad)
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(value, before[name])
    assert module.train_step_count == 1
    module.eval()
    with pytest.raises(error, match=message.replace("training model", "eval model")):
        module(*[values[a] for a in args], **{k: values[v] for k, v in kwargs.items()})


def test_after_a_bad_input_the_next_step_still_accumulates(regression, trained, rng):
    state, module, _, grad = trained
    x, t = regression_batch(rng)
    with pytest.raises(TypeError):
        module(x.astype(np.float64), t)
    module(x, t)
    single_state, single, _ = open_module(regression, optimizer=False)
    single(x, t)
    expected = grad + single_state.parameters["fc0.weight"].grad
    np.testing.assert_allclose(state.parameters["fc0.weight"].grad, expected, rtol=1e-5, atol=1e-6)


def test_bad_model_arguments(regression, tmp_path):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    with pytest.raises(FileNotFoundError, match="train_model_uri"):
        api.Module(tmp_path / "missing.onnx", state)
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        api.Module(b"not a model", state)
    with pytest.raises(TypeError, match="CheckpointState"):
        api.Module(regression["training_model"], {"fc0.weight": 1})
    with pytest.raises(TypeError, match=r"api\.CheckpointState\(state\)"):
        api.Module(regression["training_model"], checkpoint.load(regression["checkpoint"]))
    with pytest.raises(ValueError, match="lazy_reset_grad"):
        api.Module(regression["eval_model"], state)  # an eval model is no training model
    assert state.parameters["fc0.weight"].grad is None


def test_a_torch_tensor_is_told_to_be_passed_as_numpy(trained, rng):
    torch = pytest.importorskip("torch")
    _state, module, _optimizer, _grad = trained
    x, t = regression_batch(rng)
    with pytest.raises(TypeError, match=r"not Tensor: pass tensor.numpy\(\) \(tensor.cpu\(\).numpy\(\) for a tensor"):
        module(torch.from_numpy(x), t)
    module(torch.from_numpy(x).numpy(), t)  # as it says


def test_eval_without_an_eval_model(regression, rng):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    module = api.Module(regression["training_model"], state).eval()
    with pytest.raises(RuntimeError, match="no eval model"):
        module(*regression_batch(rng))
    assert module.input_names() == [] and module.output_names() == []


def test_one_hot_labels_are_told_to_take_the_argmax(classifier, rng):
    """Float one-hot labels ``[N, C]`` for int64 labels ``[N]``: ``.astype`` cannot fix them, the argmax does."""
    _state, module, _optimizer = open_module(classifier)
    x, labels = classifier_batch(rng)
    one_hot = np.eye(4, dtype=np.float32)[labels]
    with pytest.raises(TypeError, match=r"one-hot labels or class probabilities.*labels\.argmax\(axis=-1\)") as caught:
        module(x, one_hot)
    assert ".astype(np.int64)" in str(caught.value)
    with pytest.raises(TypeError, match=r"cast it with \.astype\(np\.int64\)"):  # floats of the labels' shape
        module(x, labels.astype(np.float32))
    module(x, one_hot.argmax(axis=-1).astype(np.int64))


def test_a_misspelt_parameter_name_gets_the_close_ones(regression):
    state, _, _ = open_module(regression)
    with pytest.raises(KeyError, match=r"no parameter 'fc0.weigth' in the state; did you mean 'fc0.weight', "):
        state.parameters["fc0.weigth"]


def test_a_checkpoint_without_one_of_the_models_parameters_is_named_with_its_close_ones(regression, tmp_path):
    from onnx import numpy_helper

    loaded = checkpoint.load(regression["checkpoint"])
    renamed = {("fc1.weigth" if name == "fc1.weight" else name): value for name, value in loaded.parameters.items()}
    path = tmp_path / "renamed.ckpt"
    checkpoint.save(checkpoint.from_tensors([numpy_helper.from_array(v, n) for n, v in renamed.items()]), path)
    with pytest.raises(
        ValueError, match=r"takes 'fc1.weight' .* no parameter of that name \(did you mean 'fc1.weigth'"
    ):
        api.Module(regression["training_model"], api.CheckpointState.load_checkpoint(path))


def test_a_checkpoint_of_another_model_is_told_what_the_model_takes(regression, tmp_path):
    """No name in common: the message lists the parameters the model trains, not an empty list."""
    from onnx import numpy_helper

    loaded = checkpoint.load(regression["checkpoint"])
    other = [numpy_helper.from_array(value, f"other.{name}") for name, value in loaded.parameters.items()]
    path = tmp_path / "other.ckpt"
    checkpoint.save(checkpoint.from_tensors(other), path)
    with pytest.raises(
        ValueError, match=r"does not take; it takes the parameters \['fc0.weight', .*the inputs"
    ) as error:
        api.Module(regression["training_model"], api.CheckpointState.load_checkpoint(path))
    # both files named, for the user who mixed them up
    assert f"(training model {str(regression['training_model'])!r}, checkpoint {str(path)!r})" in str(error.value)


def test_a_training_model_with_input_gradients_is_refused_saying_so(tmp_path):
    """``requires_grad`` on a graph input outputs its gradient; Module trains parameters and says so."""
    from onnxtrain import onnxblock
    from tests.helpers import MSETraining
    from tests.training import models

    block = MSETraining()
    forward = models.mlp((3, 4, 2), seed=0)
    for name in (forward.graph.input[0].name, "fc0.weight"):
        block.requires_grad(name)
    with onnxblock.base(forward):
        block(forward.graph.output[0].name)
    training, _ = block.to_model_proto()
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "checkpoint")
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    with pytest.raises(ValueError, match=r"outputs the gradients of its input\(s\) \['x'\].*Module trains parameters"):
        api.Module(training, state)


def test_a_size_named_by_an_expression_of_others_is_checked_against_them(tmp_path):
    """torch's dynamo exporter names a flattened output's size ``batch*seq``, and the labels of a loss over it
    take that name: 20 labels for 4 x 6 tokens failed in onnxruntime (``Mul_35 ... 20 by 24``), naming no input."""
    from onnx import helper

    from onnxtrain import artifacts
    from onnxtrain.training.inputs import _evaluate
    from tests.helpers import FLOAT, make_model

    assert _evaluate("batch*seq", {"batch": 4, "seq": 6}) == 24
    assert _evaluate("2*seq + 1", {"seq": 6}) == 13
    assert _evaluate("seq//2 - 1", {"seq": 6}) == 2
    assert _evaluate("batch*seq", {"batch": 4}) is None  # an unknown name
    assert _evaluate("seq ** 2", {"seq": 6}) is None  # not a dimension expression
    assert _evaluate("seq//0", {"seq": 6}) is None

    flatten = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = make_model(
        {"x": (FLOAT, ["batch", "seq", 3])}, [flatten], {"y": (FLOAT, ["batch*seq", 3])},
        initializers=[("shape", np.array([-1, 3], np.int64)), ("w", np.ones(3, np.float32))],
    )  # fmt: skip
    model.graph.node.append(helper.make_node("Mul", ["y", "w"], ["z"]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", FLOAT, ["batch*seq", 3]))
    paths = artifacts.generate_artifacts(
        model, requires_grad=["w"], loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path
    )
    module = api.Module(paths["training_model"], api.CheckpointState.load_checkpoint(paths["checkpoint"]))
    x = np.ones((4, 6, 3), np.float32)
    module(x, np.zeros(24, np.int64))
    with pytest.raises(ValueError, match=r"input 'labels' .* has batch\*seq = 20, but batch = 4 \(input 'x'\), "):
        module(x, np.zeros(20, np.int64))


def test_images_channels_last_are_told_the_transposition() -> None:
    """The command said so already; the module's step said only the two shapes."""
    from onnxtrain.training.inputs import UserInputs
    from onnxtrain.training.tensor_spec import TensorSpec

    inputs = UserInputs([TensorSpec("x", np.dtype(np.float32), ("batch", 3, 12, 12))], "training model")
    said = r"\[8, 12, 12, 3\]; its samples look channels last \(NHWC\).*numpy\.transpose\(array, \(0, 3, 1, 2\)\)"
    with pytest.raises(ValueError, match=said):
        inputs.collect([np.zeros((8, 12, 12, 3), np.float32)], {})
    with pytest.raises(ValueError, match=r"got float32\[8, 12, 12, 4\]$"):  # no order of its axes fits
        inputs.collect([np.zeros((8, 12, 12, 4), np.float32)], {})


def test_labels_with_a_trailing_unit_axis_too_many_or_too_few_are_told_to_squeeze_or_add_it() -> None:
    """ONNX Runtime's examples shape labels ``[N, 1]``; a loss here takes ``[N]``."""
    from onnxtrain.training.inputs import UserInputs
    from onnxtrain.training.tensor_spec import TensorSpec

    labels = UserInputs([TensorSpec("labels", np.dtype(np.int64), ("batch",))], "training model")
    with pytest.raises(ValueError, match=r"got int64\[5, 1\]; its last axis of size 1 .*: pass array\.squeeze\(-1\)"):
        labels.collect([np.zeros((5, 1), np.int64)], {})
    column = UserInputs([TensorSpec("target", np.dtype(np.float32), ("batch", 1))], "training model")
    with pytest.raises(
        ValueError, match=r"got float32\[5\]; the input has a last axis of size 1 .*array\[\.\.\., None\]"
    ):
        column.collect([np.zeros(5, np.float32)], {})
    with pytest.raises(ValueError, match=r"got int64\[5, 2\]$"):  # not a unit axis: nothing to say
        labels.collect([np.zeros((5, 2), np.int64)], {})


def test_an_eval_model_of_another_artifact_set_is_refused_naming_both(tmp_path):
    """Files of two generate_artifacts runs mixed: the eval step computed another loss without a word."""
    from onnxtrain.artifacts import LossType
    from tests.training import models

    model = models.mlp((4, 8, 3), seed=2)
    ce = models.generate(tmp_path / "ce", model, loss=LossType.CrossEntropyLoss)
    mse = models.generate(tmp_path / "mse", model, loss=LossType.MSELoss)
    state = api.CheckpointState.load_checkpoint(ce["checkpoint"])
    said = r"computes CrossEntropyLoss on \[.y.\], the eval model .*mse.* MSELoss on .*two generate_artifacts runs"
    with pytest.raises(ValueError, match=said):
        api.Module(ce["training_model"], state, mse["eval_model"])
    api.Module(ce["training_model"], state, ce["eval_model"])


@pytest.mark.parametrize("bad", [7, -1])
def test_ids_outside_the_table_they_look_up_are_refused_before_the_step(tmp_path, bad: int) -> None:
    """A negative id read the table's last row without a word (ONNX's Gather counts from the end), one too large
    failed in onnxruntime naming a node; torch refuses both. The step, the eval step and train_epoch say so
    before anything runs."""
    from onnx import helper

    from onnxtrain.artifacts import LossType, OptimType
    from tests.helpers import FLOAT, INT64, make_model
    from tests.training import models

    rng = np.random.default_rng(0)
    model = make_model(
        {"ids": (INT64, ["batch", 3])},
        [helper.make_node("Gather", ["table", "ids"], ["vectors"]),
         helper.make_node("ReduceMean", ["vectors"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["pooled", "head"], ["scores"])],
        {"scores": (FLOAT, ["batch", 2])},
        [("table", rng.normal(size=(7, 4)).astype(np.float32)), ("head", rng.normal(size=(4, 2)).astype(np.float32))],
        opset=13,
    )  # fmt: skip
    paths = models.generate(tmp_path, model, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    ids, labels = rng.integers(0, 7, size=(10, 3)), rng.integers(0, 2, size=10)
    ids[4, 2] = bad
    table = state.parameters["table"].data
    said = rf"input 'ids' holds 1 id\(s\) outside the 7 rows of the table 'table' it looks up \(Gather\): {bad} "
    said += r"at \[4, 2\]"
    with pytest.raises(ValueError, match=rf"^train step 1: {said}"):
        module(ids, labels)
    with pytest.raises(ValueError, match=rf"^train_epoch: {said}"):
        module.train_epoch(optimizer, [ids], labels, 4)
    module.eval()
    with pytest.raises(ValueError, match=rf"^eval step: {said}"):
        module(ids, labels)
    module.train()
    np.testing.assert_array_equal(state.parameters["table"].data, table)
    assert module.train_step_count == 0
    ids[4, 2] = 6
    module.train_epoch(optimizer, [ids], labels, 4)  # in range: trains
