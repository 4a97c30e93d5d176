"""Build optimizer models and run trajectories of steps in onnxruntime and in the NumPy reference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from onnxtrain.blocks import ForwardBlock
from onnxtrain.graph import dtypes, empty_base, tensor_type
from onnxtrain.optim import GradientClipping, Optimizer, grad_name, state_name, updated_name
from onnxtrain.sessions import inference_session

Arrays = dict[str, np.ndarray]
States = dict[str, list[np.ndarray]]


def tensors(params: Mapping[str, np.ndarray]) -> list[onnx.TensorProto]:
    """The parameters as TensorProtos, as TrainingBlock.parameters() lists the trainable ones."""
    return [numpy_helper.from_array(np.asarray(value), name) for name, value in params.items()]


class Clipped(ForwardBlock):
    """A model whose outputs are a clipping's clipped gradients, given as a list of inputs."""

    def __init__(self, clip: GradientClipping) -> None:
        super().__init__()
        self.clip = clip

    def build(self, names: list[str]) -> list[str]:
        return self.clip(names)


def clipped_in_onnx(block: ForwardBlock, grads: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``block`` (a :class:`Clipped`) built over inputs named and typed as ``grads``, run on them."""
    with empty_base() as b:
        for name, value in grads.items():
            b.add_input(name, tensor_type(dtypes.to_elem_type(value.dtype), list(value.shape)))
        block(list(grads))
    return session(block.to_model_proto()).run(None, dict(grads))


def build(optimizer: Optimizer, params: Mapping[str, np.ndarray], opset: int | None = None) -> onnx.ModelProto:
    """The optimizer model for ``params`` (built inside ``empty_base``, as with ORT's onnxblock)."""
    with empty_base(opset):
        optimizer((tensors(params), []))
    return optimizer.to_model_proto()


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return inference_session(model.SerializeToString())


def onnx_trajectory(
    optimizer: Optimizer,
    params: Mapping[str, np.ndarray],
    grads: Sequence[Mapping[str, np.ndarray]],
    lrs: Sequence[float],
    states: States | None = None,
) -> list[tuple[Arrays, States]]:
    """``(params, states)`` after each step, run by the optimizer model in onnxruntime."""
    sess = session(build(optimizer, params))
    output_names = [o.name for o in sess.get_outputs()]
    current, state = dict(params), dict(states or optimizer.initial_state(params))
    result = []
    for t, (step_grads, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        feeds: dict[str, np.ndarray] = {
            "learning_rate": np.array([lr], dtype=np.float32),
            "step": np.array([t], dtype=np.int64),
        }
        for name, value in current.items():
            feeds[name] = value
            feeds[grad_name(name)] = step_grads[name]
            for i, moment in enumerate(state[name]):
                feeds[state_name(name, i)] = moment
        outputs = dict(zip(output_names, sess.run(None, feeds), strict=True))
        current = {name: outputs[updated_name(name)] for name in current}
        state = {
            name: [outputs[updated_name(state_name(name, i))] for i in range(optimizer.num_states)] for name in current
        }
        result.append((current, state))
    return result


def reference_trajectory(
    optimizer: Optimizer,
    params: Mapping[str, np.ndarray],
    grads: Sequence[Mapping[str, np.ndarray]],
    lrs: Sequence[float],
    states: States | None = None,
) -> list[tuple[Arrays, States]]:
    """``(params, states)`` after each step, computed by the NumPy reference."""
    current, state = dict(params), dict(states or optimizer.initial_state(params))
    result = []
    for t, (step_grads, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        current, state = optimizer.reference_step(lr, t, current, step_grads, state)
        result.append((current, state))
    return result


def assert_trajectories_close(
    actual: Sequence[tuple[Arrays, States]],
    expected: Sequence[tuple[Arrays, States]],
    *,
    rtol: float,
    atol: float,
) -> None:
    """Every parameter and state equal within tolerance at every step, with the same dtype."""
    assert len(actual) == len(expected)
    for t, ((params, states), (want_params, want_states)) in enumerate(zip(actual, expected, strict=True), start=1):
        for name, value in want_params.items():
            got = params[name]
            assert got.dtype == value.dtype and got.shape == value.shape, (t, name, got.dtype, got.shape)
            np.testing.assert_allclose(
                got.astype(np.float64), value.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"{name} at step {t}"
            )
            assert len(states[name]) == len(want_states[name])
            for i, (moment, want) in enumerate(zip(states[name], want_states[name], strict=True)):
                assert moment.dtype == want.dtype and moment.shape == want.shape
                np.testing.assert_allclose(
                    moment.astype(np.float64), np.asarray(want, dtype=np.float64), rtol=rtol, atol=atol,
                    err_msg=f"{name}.momentum{i} at step {t}",
                )  # fmt: skip


def random_problem(
    shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]], steps: int, seed: int, grad_scale: float = 1.0
) -> tuple[Arrays, list[Arrays]]:
    """Random parameters and ``steps`` sets of random gradients."""
    rng = np.random.default_rng(seed)
    params = {name: np.asarray(rng.normal(size=shape), dtype=dtype) for name, (shape, dtype) in shapes.items()}
    grads = [
        {name: np.asarray(grad_scale * rng.normal(size=shape), dtype=dtype) for name, (shape, dtype) in shapes.items()}
        for _ in range(steps)
    ]
    return params, grads


def learning_rates(lr: float, steps: int, decay: float = 0.97) -> list[float]:
    """A decaying schedule of float32-exact learning rates (the model's input is float32)."""
    return [float(np.float32(lr * decay**t)) for t in range(steps)]
