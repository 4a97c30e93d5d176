"""Models with STRING user inputs (and outputs) train and evaluate as ONNX Runtime's training API does.

onnxruntime's IOBinding cannot bind string tensors, so such models run each
step with ``InferenceSession.run`` (``Module._unbound_train_step``). The
string encoder (``tests.training.models.string_encoder``: ``LabelEncoder``
from strings to float codes, then an affine map with a frozen scale) must
give exactly what the same model fed the float codes gives on the bound fast
path (reset and fused steps): losses, outputs, gradients, parameters, moments.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from onnxtrain import api
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.training import values
from tests.training import models

WORDS = np.array(["a", "b", "cé", "zz", "", "B"])  # known keys, unknown strings (code -3), the empty string


def _generate(directory: Path, strings: bool) -> dict[str, Path]:
    return models.generate(
        directory,
        models.string_encoder(strings=strings),
        requires_grad=["W", "b"],
        frozen_params=["s"],
        loss=LossType.MSELoss,
        loss_input_names=["y"],
        optimizer=OptimType.AdamW,
        additional_output_names=["y", "x_copy"] if strings else ["y"],
    )


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The string encoder's artifacts: ``x: string[batch]``, outputs loss, ``y`` and ``x_copy: string[batch]``."""
    return _generate(tmp_path_factory.mktemp("strings"), strings=True)


@pytest.fixture(scope="module")
def codes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same model on the float codes: ``x: float32[batch]``, outputs loss and ``y``."""
    return _generate(tmp_path_factory.mktemp("codes"), strings=False)


def _open(paths: dict[str, Path], **kwargs: object) -> tuple[api.CheckpointState, api.Module, api.Optimizer]:
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"], **kwargs)
    return state, module, api.Optimizer(paths["optimizer_model"], module)


#: How a test passes the same strings: NumPy str, bytes (UTF-8), object arrays of str or of bytes.
KINDS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "str": lambda words: words,
    "bytes": np.char.encode,  # S3: "cé" fills its width, as no terminating NUL shows
    "object": lambda words: words.astype(object),
    "object-bytes": lambda words: np.char.encode(words).astype(object),
}


def _batches(rng: np.random.Generator, count: int, size: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    words = [rng.choice(WORDS, size=size) for _ in range(count)]
    return [(w, rng.normal(size=(size, 3)).astype(np.float32)) for w in words]


def _gradients(state: api.CheckpointState) -> dict[str, np.ndarray | None]:
    return {name: parameter.grad for name, parameter in state.parameters}


@pytest.mark.parametrize("kind", list(KINDS))
def test_strings_train_exactly_as_their_codes(encoder, codes, kind, rng):
    """Fused steps, accumulation, lazy_reset_grad and eval steps: the same numbers, bit for bit."""
    as_kind = KINDS[kind]
    state_s, module_s, opt_s = _open(encoder)
    state_f, module_f, opt_f = _open(codes)
    assert module_s.input_names() == module_f.input_names() == ["x", "target"]
    # the premise: strings run unbound and unfused, the codes on the bound fast path (reset and fused steps)
    assert module_s.runs_unbound and opt_s.fused_step is None
    assert not module_f.runs_unbound and opt_f.fused_step is not None and module_f._reset is not None
    batches = _batches(rng, 9)

    def both(words: np.ndarray, target: np.ndarray) -> None:
        loss_s, y_s, copy = module_s(as_kind(words), target)
        loss_f, y_f = module_f(models.encode(words), target)
        np.testing.assert_array_equal(loss_s, loss_f)
        np.testing.assert_array_equal(y_s, y_f)
        assert copy.dtype == object and copy.tolist() == words.tolist()  # strings come back as str
        for name, grad in _gradients(state_s).items():
            np.testing.assert_array_equal(grad, state_f.parameters[name].grad, err_msg=name)

    for words, target in batches[:4]:  # the usual loop: on the codes, fused steps
        both(words, target)
        opt_s.step()
        opt_f.step()
        module_s.lazy_reset_grad()
        module_f.lazy_reset_grad()
    for words, target in batches[4:6]:  # gradient accumulation over two batches
        both(words, target)
    opt_s.step()
    opt_f.step()
    for words, target in batches[6:8]:  # no lazy_reset_grad: the new gradients add to the applied ones
        both(words, target)
    opt_s.step()
    opt_f.step()
    module_s.lazy_reset_grad()
    module_f.lazy_reset_grad()
    words, target = batches[8]
    both(words, target)
    for name, parameter in state_s.parameters:
        np.testing.assert_array_equal(parameter.data, state_f.parameters[name].data, err_msg=name)
    assert state_s.to_checkpoint() == state_f.to_checkpoint()  # parameters, moments, step count
    assert state_s.step == 6
    module_s.eval()
    module_f.eval()
    loss_s, y_s, copy = module_s(x=as_kind(words), target=target)
    loss_f, y_f = module_f(x=models.encode(words), target=target)
    np.testing.assert_array_equal(loss_s, loss_f)
    np.testing.assert_array_equal(y_s, y_f)
    assert copy.tolist() == words.tolist()


def test_the_first_step_matches_numpy(encoder, rng):
    """Loss and gradients of ``mean(((code @ W + b) * s - target)^2)`` from the strings."""
    state, module, _ = _open(encoder)
    weight, bias, scale = (state.parameters[name].data for name in ("W", "b", "s"))
    ((words, target),) = _batches(rng, 1, size=7)
    loss, y, _ = module(words, target)
    code = models.encode(words).astype(np.float64)[:, None]
    expected_y = (code @ weight + bias) * scale
    residual = expected_y - target
    np.testing.assert_allclose(y, expected_y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(loss, np.mean(residual**2), rtol=1e-6)
    upstream = 2 * residual / residual.size * scale
    np.testing.assert_allclose(state.parameters["W"].grad, code.T @ upstream, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(state.parameters["b"].grad, upstream.sum(axis=0), rtol=1e-5, atol=1e-7)
    assert state.parameters["s"].grad is None  # frozen


def test_the_training_session_api_takes_strings(encoder, codes, rng):
    """``TrainingSession`` (C++ names): train, optimizer and eval steps with a list of inputs."""
    session_s = api.TrainingSession(
        api.CheckpointState.load_checkpoint(encoder["checkpoint"]),
        encoder["training_model"],
        encoder["eval_model"],
        encoder["optimizer_model"],
    )
    _, module_f, opt_f = _open(codes)
    for words, target in _batches(rng, 3):
        loss_s = session_s.train_step([words, target])[0]
        session_s.optimizer_step()
        session_s.lazy_reset_grad()
        loss_f = module_f(models.encode(words), target)[0]
        opt_f.step()
        module_f.lazy_reset_grad()
        np.testing.assert_array_equal(loss_s, loss_f)
    module_f.eval()
    np.testing.assert_array_equal(session_s.eval_step([words, target])[0], module_f(models.encode(words), target)[0])


def test_bad_string_inputs_raise_before_anything_runs(encoder, rng):
    state, module, opt = _open(encoder)
    ((words, target),) = _batches(rng, 1, size=3)
    module(words, target)
    before = _gradients(state)
    with pytest.raises(TypeError, match=r"'x' of the training model is string\[batch\]; got float32\[3\]") as info:
        module(np.zeros(3, np.float32), target)
    assert ".astype(str)" in str(info.value) and "np.object" not in str(info.value)
    with pytest.raises(TypeError, match=r"element at \[1\] is int \(7\): convert the array with \.astype\(str\)"):
        module(np.array(["a", 7, "b"], dtype=object), target)
    with pytest.raises(TypeError, match=r"element at \[2\] is NoneType"):
        module(np.array(["a", "b", None], dtype=object), target)
    with pytest.raises(ValueError, match="not UTF-8"):
        module(np.array([b"a", b"\xff", b"b"]), target)
    with pytest.raises(ValueError, match=r"at \[0\] are not UTF-8"):
        module(np.array([b"\xff", b"a", b"b"], dtype=object), target)
    with pytest.raises(ValueError, match=r"'x' of the training model is string\[batch\]; got string\[3, 1\]"):
        module(words[:, None], target)
    with pytest.raises(ValueError, match=r"has batch = 4, but input 'x' has batch = 3"):
        module(words, np.zeros((4, 3), np.float32))
    for name, grad in _gradients(state).items():  # nothing ran: the gradients are those of the first step
        np.testing.assert_array_equal(grad, before[name], err_msg=name)
    assert module.train_step_count == 1
    opt.step()
    assert state.step == 1


def test_a_failed_string_step_leaves_the_state_as_it_was(encoder, codes, rng):
    """With ``check_finite``, a NaN loss (the key "nan" encodes NaN) discards the step: gradients as before."""
    state, module, opt = _open(encoder, check_finite=True)
    state_f, module_f, opt_f = _open(codes)
    batches = _batches(rng, 3)
    words, target = batches[0]
    module(words, target)
    module_f(models.encode(words), target)
    before = _gradients(state)
    with pytest.raises(FloatingPointError, match=r"train step 2 .* the loss is nan"):
        module(np.array(["a", "nan", "b", "b", "a"]), target)
    for name, grad in _gradients(state).items():
        np.testing.assert_array_equal(grad, before[name], err_msg=name)
    assert module.train_step_count == 1
    for words, target in batches[1:]:  # and training goes on as if the step had not been tried
        opt.step()
        opt_f.step()
        module.lazy_reset_grad()
        module_f.lazy_reset_grad()
        np.testing.assert_array_equal(module(words, target)[0], module_f(models.encode(words), target)[0])
    assert state.to_checkpoint() == state_f.to_checkpoint()


def test_cast_hints_are_valid_numpy_2_expressions():
    """Error hints say ``.astype(object)``, never ``np.object`` (which NumPy 2 removed)."""
    import ml_dtypes

    assert values.cast_hint(np.dtype(object)) == "object"
    assert values.cast_hint(np.dtype(np.float32)) == "np.float32"
    assert values.cast_hint(np.dtype(np.bool_)) == "np.bool_"
    assert values.cast_hint(np.dtype(ml_dtypes.bfloat16)) == "ml_dtypes.bfloat16"
    for dtype in (object, np.float32, np.bool_, np.int64, ml_dtypes.bfloat16):
        expression = values.cast_hint(np.dtype(dtype))
        assert np.dtype(eval(expression, {"np": np, "ml_dtypes": ml_dtypes})) == np.dtype(dtype)
    assert values.describe(np.dtype(object), (2, 3)) == "string[2, 3]"
