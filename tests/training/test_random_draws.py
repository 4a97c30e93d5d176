"""A module's ``seed``: each train step's random draws (Dropout) a function of the seed and the step, so that a run
resumed from a checkpoint, or run again, equals the uninterrupted one bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import api
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.training.random_draws import draws_at_random, mixed_seed
from tests.helpers import FLOAT, make_model
from tests.training.helpers import open_module, parameters

STEPS, BATCH = 6, 8


def _dropout_mlp() -> onnx.ModelProto:
    """``x [n, 5] -> MatMul -> Relu -> Dropout(0.5) -> MatMul -> Dropout(0.3, seed 11) -> y [n, 3]``: torch's
    Dropout as its exporter writes it in training mode, and one with a ``seed`` of its own (as LoRA's)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Dropout", ["a", "ratio", "training"], ["d", "mask"]),
        helper.make_node("MatMul", ["d", "W2"], ["z"]),
        helper.make_node("Dropout", ["z", "ratio2", "training"], ["y"], seed=11),
    ]
    return make_model(
        {"x": (FLOAT, ["n", 5])},
        nodes,
        {"y": (FLOAT, ["n", 3])},
        [
            ("W1", rng.normal(size=(5, 16)).astype(np.float32)),
            ("W2", rng.normal(size=(16, 3)).astype(np.float32) / 4),
            ("ratio", np.array(0.5, np.float32)),
            ("ratio2", np.array(0.3, np.float32)),
            ("training", np.array(True)),
        ],
    )


@pytest.fixture(scope="module")
def dropout_artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dropout")
    return generate_artifacts(
        _dropout_mlp(), requires_grad=["W1", "W2"], loss=LossType.MSELoss, optimizer=OptimType.AdamW,
        artifact_directory=folder,
    )  # fmt: skip


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(BATCH, 5)).astype(np.float32), rng.normal(size=(BATCH, 3)).astype(np.float32))
            for _ in range(STEPS)]  # fmt: skip


def _train(module, optimizer, batches) -> list[float]:
    losses = []
    for x, target in batches:
        losses.append(float(module(x, target)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def test_a_resumed_run_draws_what_the_uninterrupted_one_drew(dropout_artifacts, tmp_path: Path) -> None:
    """Interrupted after 2 of 6 steps and resumed from the checkpoint in new sessions (whose first step runs the
    step from reset gradients where the uninterrupted run ran the fused one): the same losses and parameters."""
    batches = _batches()
    state, module, optimizer = open_module(dropout_artifacts, seed=7)
    uninterrupted = _train(module, optimizer, batches)
    expected = parameters(state)

    state, module, optimizer = open_module(dropout_artifacts, seed=7)
    first = _train(module, optimizer, batches[:2])
    api.CheckpointState.save_checkpoint(state, tmp_path / "checkpoint", include_optimizer_state=True)
    resumed_state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = api.Module(dropout_artifacts["training_model"], resumed_state, dropout_artifacts["eval_model"], seed=7)
    optimizer = api.Optimizer(dropout_artifacts["optimizer_model"], module)
    second = _train(module, optimizer, batches[2:])
    assert first + second == uninterrupted
    for name, value in parameters(resumed_state).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def test_the_seed_decides_the_draws(dropout_artifacts) -> None:
    """The same seed: the same run, whatever ran before in the process; another seed, or none: other draws."""
    batches = _batches()
    runs = {}
    for name, seed in (("seven", 7), ("other", 8), ("seven again", 7), ("none", None)):
        _, module, optimizer = open_module(dropout_artifacts, seed=seed)
        runs[name] = _train(module, optimizer, batches)
    assert runs["seven"] == runs["seven again"]
    assert runs["other"] != runs["seven"] and runs["none"] != runs["seven"]


def test_train_epoch_and_the_loop_draw_alike(dropout_artifacts) -> None:
    """A seeded module's ``train_epoch`` steps a batch at a time: the loop's losses and parameters, bit for bit."""
    batches = _batches()
    state, module, optimizer = open_module(dropout_artifacts, seed=3)
    looped = _train(module, optimizer, batches)
    expected = parameters(state)
    state, module, optimizer = open_module(dropout_artifacts, seed=3)
    x = np.concatenate([b[0] for b in batches])
    target = np.concatenate([b[1] for b in batches])
    assert module.seeds_each_step
    epoch = module.train_epoch(optimizer, [x, target], None, BATCH)
    assert epoch.tolist() == looped
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def test_accumulated_steps_draw_anew(dropout_artifacts) -> None:
    """Train steps between two resets (gradient accumulation) each draw their own masks: the same batch twice gives
    two losses; the first step after the reset draws as before it."""
    x, target = _batches()[0]
    _, module, _ = open_module(dropout_artifacts, seed=5)
    first, second = float(module(x, target)), float(module(x, target))
    module.lazy_reset_grad()
    assert first != second and float(module(x, target)) == first


def test_which_nodes_draw_and_the_mixed_seeds() -> None:
    model = _dropout_mlp()
    assert [draws_at_random(node) for node in model.graph.node] == [False, False, True, False, True]
    inference = helper.make_node("Dropout", ["a", "ratio"], ["d"])
    assert not draws_at_random(inference)  # no training flag: it passes its input through
    seeds = {mixed_seed(seed, step, micro) for seed in (0, 1) for step in range(50) for micro in range(3)}
    assert len(seeds) == 300 and all(0 <= s < 2**63 for s in seeds)
    assert mixed_seed(7, 3, 0) == mixed_seed(7, 3, 0)


def test_a_seed_that_is_no_int_is_refused(dropout_artifacts) -> None:
    with pytest.raises(TypeError, match="seed must be an int, not float"):
        open_module(dropout_artifacts, seed=1.5)


def _bernoulli_mlp(keep: float = 0.6) -> onnx.ModelProto:
    """``x [n, 5] -> MatMul -> h * Less(RandomUniformLike(ones [n, 16]), keep) / keep -> MatMul -> y``: a channel
    dropout as torch's dynamo exporter writes ``nn.Dropout1d/2d/3d`` (its Bernoulli mask from uniform draws)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Shape", ["h"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=helper.make_tensor("v", FLOAT, [1], [1.0])),
        helper.make_node("RandomUniformLike", ["ones"], ["rands"], high=1.0, low=0.0),
        helper.make_node("CastLike", ["p", "rands"], ["p_cast"]),
        helper.make_node("Less", ["rands", "p_cast"], ["sampled"]),
        helper.make_node("Cast", ["sampled"], ["bernoulli"], to=FLOAT),
        helper.make_node("Div", ["bernoulli", "p"], ["scale"]),
        helper.make_node("Mul", ["h", "scale"], ["d"]),
        helper.make_node("MatMul", ["d", "W2"], ["y"]),
    ]
    return make_model(
        {"x": (FLOAT, ["n", 5])}, nodes, {"y": (FLOAT, ["n", 3])},
        [("W1", rng.normal(size=(5, 16)).astype(np.float32)), ("W2", rng.normal(size=(16, 3)).astype(np.float32) / 4),
         ("p", np.array(keep, np.float32))],
        opset=18,
    )  # fmt: skip


def test_bernoulli_masks_are_drawn_by_dropout_so_a_resumed_run_draws_them_again(tmp_path: Path) -> None:
    """``RandomUniformLike`` draws from a generator onnxruntime seeds when the session is made, which the step's
    seed never reached: resumed after 2 steps, a run drew other masks (a parameter 0.054 away after 4 steps)."""
    from onnxtrain.training.random_draws import bernoulli_masks_as_dropout

    model = _bernoulli_mlp()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert bernoulli_masks_as_dropout(rewritten) == 1
    types = [node.op_type for node in rewritten.graph.node]
    assert "RandomUniformLike" not in types and "Dropout" in types and "Less" not in types
    paths = generate_artifacts(
        model, requires_grad=["W1", "W2"], loss=LossType.MSELoss, optimizer=OptimType.SGD, artifact_directory=tmp_path
    )
    batches = _batches()
    state, module, optimizer = open_module(paths, seed=3)
    uninterrupted = _train(module, optimizer, batches)
    state, module, optimizer = open_module(paths, seed=3)
    first = _train(module, optimizer, batches[:2])
    api.CheckpointState.save_checkpoint(state, tmp_path / "checkpoint", include_optimizer_state=True)
    resumed = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = api.Module(paths["training_model"], resumed, seed=3)
    assert first + _train(module, api.Optimizer(paths["optimizer_model"], module), batches[2:]) == uninterrupted


def test_a_bernoulli_mask_drawn_by_dropout_keeps_its_probability() -> None:
    """The rewritten mask keeps each element with probability ``keep`` (the ``Less`` of a uniform draw did)."""
    import onnxruntime as ort

    from onnxtrain.training.random_draws import bernoulli_masks_as_dropout

    for keep in (0.6, 0.9, 1.0):
        model = _bernoulli_mlp(keep)
        model.graph.output.append(helper.make_tensor_value_info("sampled", onnx.TensorProto.BOOL, ["n", 16]))
        assert bernoulli_masks_as_dropout(model) == 1
        session = ort.InferenceSession(model.SerializeToString())
        mask = session.run(["sampled"], {"x": np.ones((20_000, 5), np.float32)})[0]
        assert abs(mask.mean() - keep) < 0.005, (keep, mask.mean())


def test_a_seeded_module_says_which_random_nodes_its_seed_does_not_reach(tmp_path: Path) -> None:
    from onnxtrain.training.random_draws import OwnGeneratorWarning

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("RandomNormalLike", ["h"], ["noise"], name="noise", scale=0.1),
        helper.make_node("Add", ["h", "noise"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, ["n", 5])}, nodes, {"y": (FLOAT, ["n", 3])}, [("W", rng.normal(size=(5, 3)))])
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(rng.normal(size=(5, 3)).astype(np.float32), "W"))
    paths = generate_artifacts(model, requires_grad=["W"], loss=LossType.MSELoss, artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    with pytest.warns(OwnGeneratorWarning, match=r"random nodes \['noise'\] draw from generators of their own"):
        api.Module(paths["training_model"], state, seed=1)
