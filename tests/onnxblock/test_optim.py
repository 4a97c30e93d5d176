"""``onnxblock.optim``: ONNX Runtime's optimizer models (sequence inputs), standard and com.microsoft."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import optim
from onnxtrain.onnxblock.optim import optimizer_of, sequence_optimizer
from onnxtrain.sessions import inference_session
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(0)
PARAMS = {"fc1.weight": RNG.normal(size=(5, 3)), "fc1.bias": RNG.normal(size=5), "fc2.weight": RNG.normal(size=(2, 5))}


def _tensors(dtype=np.float32) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(v.astype(dtype), n) for n, v in PARAMS.items()]


def _built(block: onnxblock.optim.AdamW | onnxblock.optim.SGD, dtype=np.float32) -> tuple[str, onnx.ModelProto]:
    with onnxblock.empty_base() as accessor:
        name = block((_tensors(dtype), []))
        assert accessor.model.graph.input  # ORT's users read the model from the accessor too
    return name, block.to_model_proto()


def _feeds(grads: list[np.ndarray], moments: int, dtype=np.float32, lr: float = 0.1, step: int = 1) -> dict:
    params = [v.astype(dtype) for v in PARAMS.values()]
    feeds = {"learning_rate": np.array([lr], np.float32), "step": np.array([step], np.int64),
             "params": params, "gradients": grads,
             "first_order_moments": [np.zeros_like(p) for p in params]}  # fmt: skip
    if moments == 2:
        feeds["second_order_moments"] = [np.zeros_like(p) for p in params]
    return feeds


def test_adamw_standard_model_has_ort_inputs_and_returns_updated_sequences() -> None:
    name, model = _built(onnxblock.optim.AdamW())
    assert name == "params.updated"
    assert [i.name for i in model.graph.input] == [
        "learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"
    ]  # fmt: skip
    assert [o.name for o in model.graph.output] == [
        "params.updated", "first_order_moments.updated", "second_order_moments.updated"
    ]  # fmt: skip
    assert all(node.domain in ("", "ai.onnx") for node in model.graph.node)
    assert model.graph.input[2].type.sequence_type.elem_type.tensor_type.elem_type == FLOAT


@pytest.mark.parametrize("clip", [None, 0.5])
def test_adamw_matches_torch_over_steps(clip: float | None) -> None:
    """``adam_mode=0`` is torch.optim.AdamW; with ``clip_grad``, after torch's clip_grad_norm_ (float64)."""
    torch = pytest.importorskip("torch")
    clip_block = None if clip is None else onnxblock.optim.ClipGradNorm(clip)
    block = onnxblock.optim.AdamW(weight_decay=0.1, eps=1e-8, clip_grad=clip_block, adam_mode=0)
    _, model = _built(block, np.float64)
    session = inference_session(model.SerializeToString())
    weights = [torch.tensor(v, requires_grad=True) for v in PARAMS.values()]
    reference = torch.optim.AdamW(weights, lr=0.05, eps=1e-8, weight_decay=0.1)
    params = [v.copy() for v in PARAMS.values()]
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    for step in range(1, 6):
        grads = [RNG.normal(size=p.shape) * 3 for p in params]
        for w, g in zip(weights, grads, strict=True):
            w.grad = torch.tensor(g)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(weights, clip)
        reference.step()
        feeds = {"learning_rate": np.array([0.05], np.float32), "step": np.array([step], np.int64),
                 "params": params, "gradients": grads,
                 "first_order_moments": m1, "second_order_moments": m2}  # fmt: skip
        params, m1, m2 = session.run(None, feeds)
    lr32 = float(np.float32(0.05))  # the learning-rate input is float32: compare at torch's rate with that error
    for p, w in zip(params, weights, strict=True):
        np.testing.assert_allclose(p, w.detach().numpy(), rtol=1e-6 * (1 + abs(lr32 - 0.05) * 1e8), atol=1e-7)


def test_sgd_standard_model_is_p_minus_lr_g_and_ignores_the_moments() -> None:
    name, model = _built(onnxblock.optim.SGD())
    assert [i.name for i in model.graph.input] == ["learning_rate", "step", "params", "gradients",
                                                   "first_order_moments"]  # fmt: skip
    assert [o.name for o in model.graph.output] == ["params.updated"]
    grads = [RNG.normal(size=p.shape).astype(np.float32) for p in PARAMS.values()]
    (updated,) = inference_session(model.SerializeToString()).run([name], _feeds(grads, 1, lr=0.25))
    for new, old, g in zip(updated, PARAMS.values(), grads, strict=True):
        np.testing.assert_allclose(new, old.astype(np.float32) - 0.25 * g, rtol=1e-6)


def test_adamw_default_is_onnx_runtimes_math() -> None:
    block = onnxblock.optim.AdamW(True, (0.9, 0.999), 1e-6, 0.01, None)  # ORT's positional order
    assert block.optimizer.hyperparameters()["adam_mode"] == 1
    _, model = _built(block)
    grads = [RNG.normal(size=p.shape).astype(np.float32) for p in PARAMS.values()]
    updated, _, _ = inference_session(model.SerializeToString()).run(None, _feeds(grads, 2, lr=0.01))
    for new, old, g in zip(updated, PARAMS.values(), grads, strict=True):
        old = old.astype(np.float32).astype(np.float64)
        m, v = 0.1 * g, 0.001 * g.astype(np.float64) ** 2
        want = old - 0.01 * np.sqrt(0.001) / 0.1 * m / (np.sqrt(v) + 1e-6)
        np.testing.assert_allclose(new, want - 0.01 * 0.01 * want, rtol=2e-5)


def test_onnxruntime_training_target_writes_ort_nodes() -> None:
    block = onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=onnxblock.optim.ClipGradNorm(2.5),
                                  target="onnxruntime-training")  # fmt: skip
    name, model = _built(block)
    assert name == "adamw.updated_flag"
    assert [o.name for o in model.graph.output] == ["adamw.updated_flag"]
    clip, adamw = model.graph.node
    assert (clip.op_type, clip.domain, list(clip.input)) == ("InplaceClipGradNorm", "com.microsoft", ["gradients"])
    assert adamw.op_type == "AdamWOptimizer" and adamw.domain == "com.microsoft"
    assert list(adamw.input) == ["learning_rate", "step", "params", clip.output[0], "first_order_moments",
                                 "second_order_moments"]  # fmt: skip
    attributes = {a.name: helper.get_attribute_value(a) for a in adamw.attribute}
    assert attributes["adam_mode"] == 1 and attributes["correct_bias"] == 1
    assert attributes["alpha"] == pytest.approx(0.9) and attributes["weight_decay"] == pytest.approx(0.01)
    rebuilt = optimizer_of(model)
    assert isinstance(rebuilt, optim.AdamW) and rebuilt.clip_grad.max_norm == 2.5
    sgd_name, sgd = _built(onnxblock.optim.SGD(target="onnxruntime-training"))
    (node,) = sgd.graph.node
    assert (node.op_type, sgd_name) == ("SGDOptimizerV2", "update_completed")
    assert list(node.input) == ["learning_rate", "params", "gradients"]
    assert model.ir_version <= 10


def test_standard_model_records_its_optimizer() -> None:
    _, model = _built(onnxblock.optim.AdamW(eps=1e-7, clip_grad=onnxblock.optim.ClipGradNorm(1.0)))
    rebuilt = optimizer_of(model)
    assert rebuilt.hyperparameters() == onnxblock.optim.AdamW(eps=1e-7).optimizer.hyperparameters()
    assert rebuilt.clip_grad.max_norm == 1.0


def test_optimizers_onnx_runtime_lacks_are_refused_naming_those_it_has() -> None:
    for unsupported in (optim.SGD(momentum=0.9), optim.Adam(), optim.Adagrad(), optim.RMSprop(),
                        optim.AdamW(amsgrad=True)):  # fmt: skip
        with pytest.raises(ValueError, match=r"AdamW \(without amsgrad\) and SGD \(without momentum"):
            sequence_optimizer(unsupported, "onnxruntime-training")


def test_mixed_parameter_types_cannot_share_a_sequence() -> None:
    tensors = _tensors()
    tensors[0] = numpy_helper.from_array(PARAMS["fc1.weight"], "fc1.weight")  # float64
    with onnxblock.empty_base(), pytest.raises(ValueError, match="sequence holds tensors of one element type"):
        onnxblock.optim.AdamW()((tensors, []))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("max_norm", [0.5, 1e9, float("inf")])
def test_clip_grad_norm_over_a_sequence_input_matches_torch(dtype, max_norm: float) -> None:
    """ClipGradNorm on a graph input that is a sequence of tensors (two Loops), against clip_grad_norm_."""
    torch = pytest.importorskip("torch")
    elem = onnx.TensorProto.FLOAT if dtype == np.float32 else onnx.TensorProto.DOUBLE
    base = make_model({}, [], {}, [])
    del base.graph.output[:]
    base.graph.input.append(helper.make_tensor_sequence_value_info("gradients", elem, None))

    class Clip(onnxblock.ForwardBlock):
        def build(self, name: str) -> str:
            return onnxblock.optim.ClipGradNorm(max_norm)(name)

    block = Clip()
    with onnxblock.base(base):
        out = block("gradients")
    model = block.to_model_proto()
    grads = [np.asarray(RNG.normal(size=s) * 2, dtype) for s in ((4, 3), (7,), (), (0, 2))]
    (clipped,) = inference_session(model.SerializeToString()).run([out], {"gradients": grads})
    tensors = [torch.tensor(g, requires_grad=True) for g in grads]
    for t, g in zip(tensors, grads, strict=True):
        t.grad = torch.tensor(g)
    torch.nn.utils.clip_grad_norm_(tensors, max_norm)
    assert len(clipped) == len(grads)
    for got, t in zip(clipped, tensors, strict=True):
        assert got.dtype == dtype and got.shape == tuple(t.shape)
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-6 if dtype == np.float32 else 1e-12)


def test_training_block_and_sequence_optimizer_train_the_ort_way() -> None:
    """ORT's loop on plain InferenceSessions: accumulate, step with the sequence model, reset; the loss falls."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])]
    inits = [("W", RNG.normal(size=(3, 2)).astype(np.float32)), ("B", np.zeros(2, np.float32))]
    model = make_model({"x": (FLOAT, ["batch", 3])}, nodes, {"y": (FLOAT, ["batch", 2])}, inits)

    class Training(onnxblock.TrainingBlock):
        def build(self, output_name: str) -> str:
            return onnxblock.loss.MSELoss()(output_name)

    block = Training()
    block.requires_grad("W")
    block.requires_grad("B")
    with onnxblock.base(model):
        block("y")
    training, _ = block.to_model_proto()
    optimizer = onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=onnxblock.optim.ClipGradNorm(1.0))
    with onnxblock.empty_base():
        optimizer(block.parameters())
    train = inference_session(training.SerializeToString())
    step = inference_session(optimizer.to_model_proto().SerializeToString())
    values = {t.name: numpy_helper.to_array(t) for t in block.parameters()[0]}
    moments = [[np.zeros_like(v) for v in values.values()] for _ in range(2)]
    x = RNG.normal(size=(16, 3)).astype(np.float32)
    target = (x @ RNG.normal(size=(3, 2))).astype(np.float32)
    outputs = [training.graph.output[0].name, "W_grad.accumulation.out", "B_grad.accumulation.out"]
    losses = []
    for t in range(1, 41):
        buffers = {f"{n}_grad.accumulation.buffer": np.zeros_like(v) for n, v in values.items()}
        loss, *grads = train.run(outputs, {"x": x, "target": target, **values, **buffers,
                                           "lazy_reset_grad": np.array([True])})  # fmt: skip
        losses.append(float(loss))
        feeds = {"learning_rate": np.array([0.05], np.float32), "step": np.array([t], np.int64),
                 "params": list(values.values()), "gradients": grads, "first_order_moments": moments[0],
                 "second_order_moments": moments[1]}  # fmt: skip
        new_params, moments[0], moments[1] = step.run(None, feeds)
        values = dict(zip(values, new_params, strict=True))
    assert losses[-1] < 0.5 * losses[0]
