"""Large constants held once for all the sessions (onnxtrain.training.constants).

A model whose frozen weights are initializers (LoRA over a frozen base) has
each held once, on the module's device: as external initializers of every
session (onnxruntime may prepack them), or, from ``LIFT_BYTES`` of them on,
off the CPU and under the caller's session options, as inputs bound to the
same OrtValue in every session. Either way every number is the one of a
module that shares nothing: losses, eval outputs, and every parameter,
gradient and moment after each step, bit for bit; across accumulation, a
short last batch, train_epoch, string inputs, data files, and a name the
eval model gives other values.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import optim
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.graph import external
from onnxtrain.graph.external import SHARED_LOCATION
from onnxtrain.training import constants
from onnxtrain.training.device import resolve
from onnxtrain.training.models import load_model
from tests.training import helpers, models

#: The constants fc1.weight, 512 x 512 float32, exactly SHARED_CONSTANT_BYTES, and fc2.weight, 512 x 511, four
#: bytes a row under it; fc0 and fc3 are trained.
SIZES = (64, 512, 512, 511, 3)
TRAINED = ["fc0.weight", "fc0.bias", "fc3.weight", "fc3.bias"]

#: (SHARED_CONSTANT_BYTES, LIFT_BYTES) of each way of sharing; "none" shares nothing (the reference).
MODES = {
    "none": (1 << 62, 1 << 62),
    "initializers": (None, None),  # the defaults: under LIFT_BYTES, as initializers
    "inputs": (None, 0),
    "every constant as an input": (1, 0),
}


@pytest.fixture(scope="module")
def frozen_base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MLP 64-512-512-511-3 training its first and last layers; the two middle weights are constants, one of
    the threshold's size and one under it; cross-entropy; SGD with momentum (an update proportional to the
    gradients, so that a rounding of theirs stays that size: AdamW's normalized update can turn one unit in
    the last place of a gradient near zero into a change of the learning rate's size)."""
    return models.generate(
        tmp_path_factory.mktemp("frozen_base"),
        models.mlp(SIZES, seed=3),
        requires_grad=TRAINED,
        loss=LossType.CrossEntropyLoss,
        optimizer=optim.SGD(momentum=0.9),
    )


@pytest.fixture
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    min_bytes, lift_bytes = MODES[request.param]
    if min_bytes is not None:
        monkeypatch.setattr(constants, "SHARED_CONSTANT_BYTES", min_bytes)
    if lift_bytes is not None:
        monkeypatch.setattr(constants, "LIFT_BYTES", lift_bytes)
    yield request.param


def _sessions(module: Any, optimizer: Any) -> list[Any]:
    """Every session the module and its optimizer made so far."""
    made = [module._train_session, module._eval_session, optimizer._session]
    if module._reset is not None:
        made.append(module._reset.session)
    if module._fused is not None:
        made += module._fused.sessions()
    return made


def _batch(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.normal(size=(n, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], size=n).astype(np.int64)


def _run(paths: dict[str, Path], **options: Any) -> list[Any]:
    """Losses, eval outputs and snapshots of a short run: plain steps, two accumulated batches, a batch of 5."""
    state, module, optimizer = helpers.open_module(paths, **options)
    rng = np.random.default_rng(0)
    record: list[Any] = []
    for sizes in ([16], [16], [8, 8], [5], [16]):
        for n in sizes:
            record.append(np.asarray(module(*_batch(rng, n))))
        optimizer.step()
        module.lazy_reset_grad()
        record.append(helpers.snapshot(state))
    module.eval()
    record.append(np.asarray(module(*_batch(rng, 7))))
    return record


def _assert_same(actual: list[Any], expected: list[Any], exact: bool = True) -> None:
    """Each array equal, bit for bit where ``exact``; else within 2e-6 of the tensor's largest magnitude."""
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        pairs = [(name, got[name], want[name]) for name in want] if isinstance(want, dict) else [("", got, want)]
        if isinstance(want, dict):
            assert got.keys() == want.keys()
        for name, a, b in pairs:
            if exact:
                np.testing.assert_array_equal(a, b, err_msg=name)
            else:
                scale = float(np.max(np.abs(b))) if np.size(b) else 0.0
                np.testing.assert_allclose(a, b, rtol=0, atol=2e-6 * max(scale, 1e-30), err_msg=name)


@pytest.fixture(scope="module")
def reference(frozen_base: dict[str, Path]) -> list[Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "SHARED_CONSTANT_BYTES", MODES["none"][0])
        return _run(frozen_base)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "none"], indirect=True)
def test_every_number_is_that_of_a_module_sharing_nothing(
    frozen_base: dict[str, Path], reference: list[Any], mode: str
) -> None:
    """As initializers, onnxruntime computes as from the model's own; as inputs, it multiplies by the frozen
    weights without prepacking them, and by their transposes without folding them, whose sums may round
    differently (by one unit in the last place)."""
    _assert_same(_run(frozen_base), reference, exact=mode == "initializers")


@pytest.mark.parametrize("mode", ["initializers", "inputs"], indirect=True)
def test_the_threshold_and_one_value_for_every_session(frozen_base: dict[str, Path], mode: str) -> None:
    """fc1.weight (the threshold's size) is held once; fc2.weight (4 bytes a row under) stays in the models.
    As inputs, every session binds the module's one OrtValue; as initializers, none takes it as an input."""
    _, module, optimizer = helpers.open_module(frozen_base)
    rng = np.random.default_rng(1)
    for _ in range(3):
        module(*_batch(rng, 4))
        optimizer.step()
        module.lazy_reset_grad()
    table = module._constants
    assert "fc1.weight" in table and "fc2.weight" not in table and len(table) == 1
    assert table.as_inputs == (mode == "inputs")
    sessions = _sessions(module, optimizer)
    assert len(sessions) == 5  # training, eval, optimizer, from reset, fused
    for session in sessions:
        takes = {value.name for value in session.session.get_inputs()}
        reads = session is not sessions[2]  # all but the optimizer's model read the weight
        assert ("fc1.weight" in takes) == (reads and mode == "inputs"), session.what
        assert "fc2.weight" not in takes
        if reads and mode == "inputs":
            assert session.constants["fc1.weight"] is table.value("fc1.weight")
    stubs = [t for t in module._train_model.proto.graph.initializer if t.name == "fc1.weight"]
    assert [s.external_data[0].value for s in stubs] == [SHARED_LOCATION]
    assert not stubs[0].raw_data


@pytest.mark.parametrize("mode", ["initializers"], indirect=True)
def test_the_callers_session_options_take_them_as_inputs(
    frozen_base: dict[str, Path], reference: list[Any], mode: str
) -> None:
    """Options shared by every session must not change: the constants are inputs there, whatever their size."""
    options = ort.SessionOptions()
    _assert_same(_run(frozen_base, session_options=options), reference, exact=False)
    _, module, _ = helpers.open_module(frozen_base, session_options=options)
    takes = {value.name for value in module._train_session.session.get_inputs()}
    assert "fc1.weight" in takes


@pytest.mark.parametrize("mode", ["initializers", "inputs"], indirect=True)
def test_models_with_their_constants_in_data_files(
    frozen_base: dict[str, Path], reference: list[Any], tmp_path: Path, mode: str
) -> None:
    """Artifacts whose constants all lie in data files (small ones too): each is read a tensor at a time, the
    large one shared, the others read into the models; the numbers stay."""
    paths = dict(frozen_base)
    for key in ("training_model", "eval_model"):
        model = onnx.load(frozen_base[key])
        target = tmp_path / frozen_base[key].name
        onnx.save(model, target, save_as_external_data=True, location=f"{target.name}.data", size_threshold=0)
        paths[key] = target
    _assert_same(_run(paths), reference, exact=mode == "initializers")
    _, module, _ = helpers.open_module(paths)
    assert "fc1.weight" in module._constants and len(module._constants) == 1
    in_files = [t.name for t, _ in external.model_tensors(module._train_model.proto) if t.external_data]
    assert in_files == ["fc1.weight"]  # its stub; the smaller ones came inside


@pytest.mark.parametrize("mode", ["initializers", "inputs"], indirect=True)
def test_an_eval_model_with_other_values_under_a_shared_name(
    frozen_base: dict[str, Path], tmp_path: Path, mode: str
) -> None:
    """The eval model keeps its own values where they differ from the training model's."""
    eval_model = onnx.load(frozen_base["eval_model"])
    weight = next(t for t in eval_model.graph.initializer if t.name == "fc1.weight")
    halved = onnx.numpy_helper.to_array(weight) * np.float32(0.5)
    weight.CopyFrom(onnx.numpy_helper.from_array(halved, "fc1.weight"))
    path = tmp_path / "eval_model.onnx"
    onnx.save(eval_model, path)
    state, module, _ = helpers.open_module({**frozen_base, "eval_model": path})
    x, labels = _batch(np.random.default_rng(2), 6)
    module.eval()
    got = np.asarray(module(x, labels))
    feeds = {"x": x, "labels": labels, **helpers.parameters(state)}
    expected = helpers.run_onnx(path, feeds)
    np.testing.assert_array_equal(got, next(iter(expected.values())))


@pytest.mark.parametrize("mode", ["initializers", "inputs"], indirect=True)
def test_the_export_holds_the_constants(frozen_base: dict[str, Path], tmp_path: Path, mode: str) -> None:
    _, module, _ = helpers.open_module(frozen_base, optimizer=False)
    target = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(target, ["y"])
    exported = onnx.load(target)
    original = onnx.load(frozen_base["eval_model"])
    by_name = {t.name: onnx.numpy_helper.to_array(t) for t in original.graph.initializer}
    weight = next(t for t in exported.graph.initializer if t.name == "fc1.weight")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight), by_name["fc1.weight"])
    x, _ = _batch(np.random.default_rng(3), 3)
    assert helpers.run_onnx(target, {"x": x})["y"].shape == (3, SIZES[-1])


@pytest.mark.parametrize("mode", ["inputs", "every constant as an input"], indirect=True)
def test_train_epoch(frozen_base: dict[str, Path], mode: str) -> None:
    """The epoch model's scan body holds the stubs: they are lifted to the outer graph, the numbers stay."""
    rng = np.random.default_rng(4)
    x, labels = _batch(rng, 37)  # 37 = 4 batches of 8 and one of 5

    def losses(share: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        with pytest.MonkeyPatch.context() as patch:
            if not share:
                patch.setattr(constants, "SHARED_CONSTANT_BYTES", MODES["none"][0])
            state, module, optimizer = helpers.open_module(frozen_base)
            return module.train_epoch(optimizer, x, labels, 8), helpers.snapshot(state)

    shared, unshared = losses(True), losses(False)
    _assert_same([shared[0], shared[1]], [unshared[0], unshared[1]], exact=False)


@pytest.mark.parametrize("mode", ["every constant as an input"], indirect=True)
@pytest.mark.parametrize("fixture", [*helpers.STEP_FIXTURES, "strings"])
def test_the_runtime_fixtures_with_every_constant_shared(
    request: pytest.FixtureRequest, fixture: str, mode: str, tmp_path: Path
) -> None:
    """Every initializer of the runtime's other models (the losses' and shapes' constants) held apart and bound
    as an input: the same numbers as sharing nothing, on the fused, reset and unbound (string) paths."""
    if fixture == "strings":
        paths = models.generate(
            tmp_path,
            models.string_encoder(),
            requires_grad=["W", "b"],
            frozen_params=["s"],
            loss=LossType.MSELoss,
            loss_input_names=["y"],
            optimizer=OptimType.AdamW,
            additional_output_names=["y", "x_copy"],
        )
        rng = np.random.default_rng(5)
        words = np.array(["a", "b", "cé", "zz", "a", "nan"], dtype=object)
        batch: tuple[np.ndarray, ...] = (words, rng.normal(size=(6, 3)).astype(np.float32))
    else:
        paths = request.getfixturevalue(fixture)
        batch = helpers.fixture_batch(fixture, np.random.default_rng(5))

    def run() -> list[Any]:
        state, module, optimizer = helpers.open_module(paths)
        record = []
        for _ in range(3):
            record.append(module(*batch))
            optimizer.step()
            module.lazy_reset_grad()
            record.append(helpers.snapshot(state))
        return [r if isinstance(r, dict) else np.asarray(r[0] if isinstance(r, tuple) else r) for r in record]

    shared = run()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "SHARED_CONSTANT_BYTES", MODES["none"][0])
        _assert_same(shared, run())


def test_shared_and_lifted_models_are_valid_onnx(frozen_base: dict[str, Path]) -> None:
    """What onnxruntime loads in the lifted form is a valid model (the stubs become typed inputs)."""
    table = constants.SharedConstants(resolve(None, None)[0], lift_bytes=0)
    shared = table.share(load_model(frozen_base["training_model"], "training model"), "training model")
    lifted, values = table.lift(shared)
    assert list(values) == ["fc1.weight"]
    onnx.checker.check_model(lifted.proto)
    assert lifted.proto.graph.input[-1].name == "fc1.weight"
    assert not any(t.name == "fc1.weight" for t in lifted.proto.graph.initializer)


def test_shapes_are_inferred_over_stubs() -> None:
    """onnxruntime's shape inference (for the fused step's static shapes) sees through the stubs: a copy that
    is never run takes them as inputs."""
    from onnx import TensorProto, helper

    from onnxtrain.sessions import inferred_shapes

    weight = onnx.numpy_helper.from_array(np.ones((3, 4), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # opset 17's IR
    shared = constants.SharedConstants(resolve(None, None)[0], min_bytes=1).share(load_model(model, "model"), "model")
    assert constants.is_shared_stub(shared.proto.graph.initializer[0])
    assert inferred_shapes(shared.proto, ["h", "y"]) == {"h": [2, 4], "y": [2, 4]}


@pytest.mark.parametrize("second", [2.0, 3.0])
def test_a_name_two_models_share_is_held_once_where_the_values_agree(second: float) -> None:
    """Scalars (0-d) too: the second model's constant is a stub where its value is the first's, else its own."""
    from onnx import TensorProto, helper

    def model(value: float) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("Mul", ["x", "c"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            [onnx.numpy_helper.from_array(np.array(value, np.float32), "c")],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    table = constants.SharedConstants(resolve(None, None)[0], min_bytes=1)
    first = table.share(load_model(model(2.0), "first"), "first")
    other = table.share(load_model(model(second), "second"), "second")
    assert constants.is_shared_stub(first.proto.graph.initializer[0]) and len(table) == 1
    assert constants.is_shared_stub(other.proto.graph.initializer[0]) == (second == 2.0)


@pytest.mark.parametrize("lift_bytes", [0, 1 << 40], ids=["inputs", "initializers"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(2, 3), ()])
def test_constants_of_every_float_type_and_rank(dtype: str, shape: tuple[int, ...], lift_bytes: int) -> None:
    """A shared constant of each float type (bfloat16 as its bits), 2-D and 0-d, as inputs and as external
    initializers (which onnxruntime takes from memory the caller owns): the session computes with its values,
    and the export puts them back."""
    import ml_dtypes
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from onnxtrain.training.binding import BoundSession

    np_type = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    weight = (np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5 if shape else np.array(1.5, np.float32)).astype(
        np_type
    )
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["W"], ["w"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "w"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [onnx.numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    device = resolve(None, None)[0]
    table = constants.SharedConstants(device, min_bytes=1, lift_bytes=lift_bytes)
    shared = table.share(load_model(model, "model"), "model")
    assert constants.is_shared_stub(shared.proto.graph.initializer[0])
    session = BoundSession(
        shared, "model", ort.SessionOptions(), ["CPUExecutionProvider"], device, constants=table, own_options=True
    )
    x = np.full((2, 3), 2.0, np.float32)
    session.bind_input("x", x)
    session.bind_output("y", device)
    session.run()
    np.testing.assert_array_equal(session.outputs(1)[0].numpy(), x * weight.astype(np.float32))
    restored = onnx.numpy_helper.to_array(table.restore(shared.proto).graph.initializer[0])
    assert restored.shape == weight.shape
    np.testing.assert_array_equal(restored.astype(np.float32), weight.astype(np.float32))
