"""Small helpers for the runtime tests: opening artifacts, data, running models directly."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnxtrain import api
from onnxtrain.sessions import inference_session


def open_module(
    paths: Mapping[str, Path], *, optimizer: bool = True, fuse: bool = True, as_on_a_gpu: bool = False, **kwargs: Any
) -> tuple[Any, Any, Any]:
    """``(state, module, optimizer)`` from freshly loaded artifacts; ``fuse`` goes to the Optimizer;
    ``as_on_a_gpu``: its fused step as on a GPU (a session for every step shape, the update's chains packed)."""
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"], **kwargs)
    opt = api.Optimizer(paths["optimizer_model"], module, fuse=fuse) if optimizer else None
    if as_on_a_gpu and opt is not None and opt.fused_step is not None:
        opt.fused_step.fold_every_shape = opt.fused_step.pack_updates = True
    return state, module, opt


def regression_batch(rng: np.random.Generator, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """``x: float32[n, 4]``, ``target: float32[n, 3]``."""
    return rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=(n, 3)).astype(np.float32)


def classifier_batch(rng: np.random.Generator, n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``x: float32[n, 6]``, ``labels: int64[n]`` in 0..3, learnable from x."""
    x = rng.normal(size=(n, 6)).astype(np.float32)
    labels = (np.argmax(x[:, :4], axis=1)).astype(np.int64)
    return x, labels


def parameters(state: Any) -> dict[str, np.ndarray]:
    """``{name: value}`` of every parameter of an api.CheckpointState."""
    return {name: parameter.data for name, parameter in state.parameters}


def run_onnx(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All outputs of a model run directly in onnxruntime."""
    session = inference_session(str(path))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, dict(feeds)), strict=True))


#: The session-scoped artifact fixtures of tests/training/conftest.py that the step tests run over.
STEP_FIXTURES = ["regression", "classifier", "momentum", "batchnorm", "mixed"]


def fixture_batch(fixture: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A batch for the models of the artifact fixture named ``fixture``."""
    if fixture == "classifier":
        return classifier_batch(rng)
    if fixture == "mixed":
        return (rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 2)))
    return regression_batch(rng)


def snapshot(state: Any) -> dict[str, np.ndarray]:
    """Parameters (running statistics included), gradients, moments and the step count: all a step may change."""
    saved = state.to_checkpoint(include_optimizer_state=True)
    values = {f"param {n}": np.asarray(v) for n, v in saved.parameters.items()}
    for name, parameter in state.parameters:
        if parameter.grad is not None:
            values[f"grad {name}"] = parameter.grad
    if saved.optimizer is not None:
        values["step"] = np.array(saved.optimizer.step)
        for name, moments in saved.optimizer.moments.items():
            values.update({f"moment{i} {name}": np.asarray(m) for i, m in enumerate(moments)})
    return values


def count_fused_runs(fused: Any) -> list[int]:
    """Count the runs of a fused step's sessions (the general one and the one for fixed shapes, made at its
    first step); the count is the list's one item."""
    runs = [0]
    counted: set[int] = set()
    session_for = fused.session_for

    def counting(shapes: Any) -> Any:
        session = session_for(shapes)
        if id(session) not in counted:
            counted.add(id(session))
            count_runs(session, runs)
        return session

    fused.session_for = counting
    return runs


def count_runs(session: Any, runs: list[int] | None = None) -> list[int]:
    """Wrap ``session.run`` (of this one object) to count its calls; the count is the list's one item (``runs``
    where given, to count several sessions together)."""
    runs = [0] if runs is None else runs
    run = session.run

    def counted() -> None:
        runs[0] += 1
        run()

    session.run = counted
    return runs
