"""RNN, GRU and LSTM: whole models against torch autograd, and strict finite-difference checks.

- **torch autograd**: three sequence classifiers (``nn.RNN`` with Relu, 2 layers,
  batch first; ``nn.GRU`` bidirectional, time first; ``nn.LSTM``, 2 layers,
  batch first) under a Linear head and cross-entropy, exported by the
  TorchScript exporter with a symbolic batch and sequence axis, trained by
  onnxtrain's training model (onnxblock API). The loss and every parameter's
  gradient must match torch's at two sequence lengths and two batch sizes,
  with the same training model. The LSTM classifier also trains through
  ``generate_artifacts`` and the runtime (``onnxtrain.api``).
- **finite differences, strictly**: ``test_rules.py`` excuses a failing check
  when onnxruntime's forward disagrees with ``onnx.reference``, which ignores
  ``sequence_lens``; here the sequence-length specs (and sequences of length 0)
  are checked without that excuse, and so are a node whose ``Y`` output the
  model omits, a batch of one, and LSTM peepholes without initial states.
- **clip** against a float64 torch transcription of the ONNX equations (finite
  differences would cross the kinks of the clipping).
- **refused attributes**: ``input_forget``, a non-positive ``clip`` and other
  activations are errors that name the attribute.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, reject
from hypothesis import strategies as st
from onnx import helper
from packaging.version import Version

from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from onnxtrain.sessions import inference_session
from tests.autodiff import gradcheck, models, specs_recurrent
from tests.autodiff.models import Runner
from tests.autodiff.specs import Arg, Case, Extra
from tests.helpers import export_for_training

NAMES = ("rnn", "gru", "lstm")
FEATURES, HIDDEN, CLASSES = 3, 4, 3
#: The oldest onnxruntime seen to give sequences of length 0 zero final states (RNN's: microsoft/onnxruntime#28052).
EMPTY_SEQUENCES_SINCE = "1.32"
#: (sequence length, batch size) pairs run through one training model.
SIZES = ((2, 3), (6, 1))


# ---------------------------------------------------------------- torch autograd


def _module(name: str) -> Any:
    """The classifier ``name`` (seeded): recurrent layers, then a Linear on a hidden state or the outputs."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if name == "rnn":
                self.rnn: nn.Module = nn.RNN(FEATURES, HIDDEN, num_layers=2, nonlinearity="relu", batch_first=True)
            elif name == "gru":
                self.rnn = nn.GRU(FEATURES, HIDDEN, bidirectional=True)
            else:
                self.rnn = nn.LSTM(FEATURES, HIDDEN, num_layers=2, batch_first=True)
            self.head = nn.Linear(2 * HIDDEN if name == "gru" else HIDDEN, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if name == "rnn":  # the last layer's final state
                _, h = self.rnn(x)
                return self.head(h[-1])
            if name == "gru":  # time first: the outputs, averaged over time
                y, _ = self.rnn(x)
                return self.head(y.mean(dim=0))
            y, _ = self.rnn(x)  # the last step's output
            return self.head(y[:, -1])

    return Classifier()


def _batch_first(name: str) -> bool:
    return name != "gru"


def _data(name: str, steps: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (batch, steps, FEATURES) if _batch_first(name) else (steps, batch, FEATURES)
    return {"x": rng.normal(size=shape).astype(np.float32), "labels": rng.integers(0, CLASSES, batch).astype(np.int64)}


def _export(module: Any, name: str) -> onnx.ModelProto:
    """The TorchScript export, batch and sequence axes symbolic (as in ``models.export_torch``)."""
    import torch

    example = torch.from_numpy(_data(name, 4, 2, 0)["x"])
    axes = {0: "batch", 1: "steps"} if _batch_first(name) else {0: "steps", 1: "batch"}
    return export_for_training(
        module, (example,), ["x"], ["y"], opset=models.OPSET, dynamic_axes={"x": axes, "y": {0: "batch"}}
    )


@dataclass(frozen=True)
class Trained:
    module: Any
    training: onnx.ModelProto
    runner: Runner
    params: dict[str, np.ndarray]


@functools.cache
def _trained(name: str) -> Trained:
    module = _module(name)
    model = _export(module, name)
    trainable = tuple(k for k, _ in module.named_parameters())
    initializers = {t.name for t in model.graph.initializer}
    assert set(trainable) <= initializers, f"the export misses parameters {set(trainable) - initializers}"
    training = models.training_block(model, "cross_entropy", trainable).gradient_models.training
    params = {k: v.detach().numpy().copy() for k, v in module.named_parameters()}
    return Trained(module, training, Runner(training), params)


@pytest.mark.parametrize(("steps", "batch"), SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_recurrent_classifier_gradients_match_torch(name: str, steps: int, batch: int) -> None:
    torch = pytest.importorskip("torch")
    trained = _trained(name)
    graph = trained.training.graph
    assert {n.op_type for n in graph.node} >= {name.upper(), "Scan"}
    assert all(node.domain in ("", "ai.onnx") for node in graph.node), "only standard ONNX operators"
    data = _data(name, steps, batch, seed=steps)
    feeds = {**data, **trained.params}
    out = trained.runner({v.name: feeds[v.name] for v in graph.input})
    module = trained.module
    module.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(module(torch.from_numpy(data["x"])), torch.from_numpy(data["labels"]))
    loss.backward()
    np.testing.assert_allclose(out[graph.output[0].name], loss.item(), rtol=1e-5)
    for param, tensor in module.named_parameters():
        want = tensor.grad.numpy()
        got = out[f"{param}_grad"]
        assert got.shape == want.shape, f"{param}_grad: {got.shape}, torch {want.shape}"
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=f"{name}: {param}"
        )


def test_lstm_classifier_trains_through_the_artifacts_and_runtime(tmp_path: Path) -> None:
    """``generate_artifacts`` + ``onnxtrain.api``: the training model (its Scans included) runs in the
    runtime at two sequence lengths, and AdamW steps lower the loss."""
    pytest.importorskip("torch")
    from onnxtrain import api
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts

    module = _module("lstm")
    params = [k for k, _ in module.named_parameters()]
    generate_artifacts(
        _export(module, "lstm"),
        requires_grad=params,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    model = api.Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = api.Optimizer(tmp_path / "optimizer_model.onnx", model)
    optimizer.set_learning_rate(0.05)
    model.train()
    batches = [_data("lstm", steps, 8, seed=steps) for steps in (3, 5)]
    losses = []
    for step in range(20):
        batch = batches[step % 2]
        losses.append(float(model(batch["x"], batch["labels"])))
        optimizer.step()
        model.lazy_reset_grad()
    assert losses[-2] + losses[-1] < 0.8 * (losses[0] + losses[1]), losses


# ---------------------------------------------------------------- finite differences, strictly

LENS_SPECS = [
    *(spec for spec in specs_recurrent.SPECS if "sequence-lens" in spec.variant),
    *specs_recurrent.EMPTY_SEQUENCE_SPECS,
]


@pytest.mark.parametrize("spec", LENS_SPECS, ids=[spec.id for spec in LENS_SPECS])
@given(data=st.data())
def test_sequence_lens_gradients_match_finite_differences(spec: Any, data: st.DataObject) -> None:
    """Steps past a sequence's length output zeros and carry the state (onnxruntime): no excuse here.

    A sequence of length 0 has zero final states in onnxruntime 1.32 (the rule's semantics); 1.23.2
    leaves RNN's undefined (microsoft/onnxruntime#28052).
    """
    if "empty" in spec.variant and Version(ort.__version__) < Version(EMPTY_SEQUENCES_SINCE):
        pytest.skip(f"onnxruntime {ort.__version__} gives sequences of length 0 undefined final states")
    case = data.draw(spec.cases, label="case")
    mode = data.draw(st.sampled_from(gradcheck.DIM_MODES), label="dims")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    result = gradcheck.check(spec, case, mode, seed, gradcheck.build_cached(spec, case, mode))
    if result is None:
        reject()
    assert result.ok, f"{spec.id}: <t, grad> = {result.analytic!r}, finite difference = {result.numeric!r}"


def _projected_loss(model: onnx.ModelProto, outputs: list[str], wrt: list[str]) -> tuple[Any, list[str]]:
    """A session computing ``sum_u sum(y_u * c_u)`` and its gradients for ``wrt``; the names ``c_u``."""
    builder = GraphBuilder(model)
    projected = [builder.add_input(f"c_{y}", builder.type_of(y)) for y in outputs]
    terms = [
        builder.add_node1("ReduceSum", [builder.add_node1("Mul", [y, c])], keepdims=0)
        for y, c in zip(outputs, projected, strict=True)
    ]
    loss = terms[0] if len(terms) == 1 else builder.add_node1("Sum", terms)
    grads = build_gradients(builder, loss, wrt)
    builder.set_outputs([loss, *(grads[w] for w in wrt)])
    return inference_session(builder.finalize().SerializeToString()), projected


@pytest.mark.parametrize("lengths", [None, (2,)])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_batch_of_one(op: str, lengths: tuple[int, ...] | None) -> None:
    """One sequence, both directions, every input and output (static shapes: ``gradcheck`` probes
    partly symbolic outputs with shapes of ones, which a static ``Y_h`` of one row refuses)."""
    spec = specs_recurrent.recurrent(op, full=True, lens=lengths is not None)
    hidden, gates = 2, specs_recurrent.GATES[op] * 2
    shapes = [(3, 1, 2), (2, gates, 2), (2, gates, hidden), (2, 2 * gates), (2, 1, hidden)]
    shapes += [(2, 1, hidden), (2, 3 * hidden)] if op == "LSTM" else []
    attrs = (("direction", "bidirectional"), ("hidden_size", hidden))
    extras = () if lengths is None else (Extra(4, lengths, dtype=np.int32),)
    n_outputs = 3 if op == "LSTM" else 2
    case = Case(tuple(shapes), attrs, extras, tuple(range(n_outputs)), n_outputs)
    compiled = gradcheck.build(spec, case, "static")
    for seed in range(3):
        result = gradcheck.check(spec, case, "static", seed, compiled)
        assert result is not None and result.ok, (seed, result)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_lstm_peepholes_without_initial_states(direction: str) -> None:
    """P given, B, initial_h and initial_c omitted: the cell recurrence starts from zeros."""
    weights = specs_recurrent.WEIGHTS
    spec = replace(
        specs_recurrent.recurrent("LSTM", full=False),
        args=(Arg(), Arg(weights), Arg(weights), Arg(weights)),
        wiring=(0, 1, 2, None, None, None, None, 3),
        variant="peepholes-only",
    )
    case = Case(
        ((4, 2, 3), (1, 8, 3), (1, 8, 2), (1, 6)), (("direction", direction), ("hidden_size", 2)), (), (0, 2), 3
    )
    for mode in ("static", "unknown"):
        compiled = gradcheck.build(spec, case, mode)
        for seed in range(3):
            result = gradcheck.check(spec, case, mode, seed, compiled)
            assert result is not None and result.ok, (mode, seed, result)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_gradients_when_the_model_omits_y(op: str) -> None:
    """Only ``Y_h`` (and ``Y_c``) are outputs of the node; the gradient graph declares ``Y`` and reads it."""
    spec = specs_recurrent.recurrent(op, full=True)
    n_outputs = 3 if op == "LSTM" else 2
    attrs = (("direction", "bidirectional"), ("hidden_size", 2))
    gates = specs_recurrent.GATES[op] * 2
    shapes = [(3, 2, 2), (2, gates, 2), (2, gates, 2), (2, 2 * gates), (2, 2, 2)]
    shapes += [(2, 2, 2), (2, 6)] if op == "LSTM" else []
    case = Case(tuple(shapes), attrs, (), tuple(range(n_outputs - 1)), n_outputs - 1)
    forward = gradcheck.forward_model(spec, case, "named")
    node = next(n for n in forward.model.graph.node if n.name == "op")
    node.output[:] = ["", *(f"y{u}" for u in range(n_outputs - 1))]
    wrt = [name for name, *_ in forward.args]
    session, projected = _projected_loss(forward.model, [f"y{u}" for u in range(n_outputs - 1)], wrt)
    rng = np.random.default_rng(0)
    values = {name: gradcheck.sample(rng, arg, shape, dtype) for name, arg, shape, dtype in forward.args}
    feeds = {**values, **{c: rng.normal(size=(2, 2, 2)).astype(np.float32) for c in projected}}
    out = session.run(None, feeds)
    directions = {name: rng.normal(size=v.shape).astype(np.float32) for name, v in values.items()}
    analytic = sum(float(np.sum(directions[w] * g)) for w, g in zip(wrt, out[1:], strict=True))

    def f(step: float) -> float:
        moved = {**feeds, **{w: (values[w] + step * directions[w]).astype(np.float32) for w in wrt}}
        return float(session.run(None, moved)[0])

    h = 1e-2
    numeric = (4 * (f(h / 2) - f(-h / 2)) / h - (f(h) - f(-h)) / (2 * h)) / 3
    assert abs(analytic - numeric) <= 2e-3 * (abs(analytic) + 1.0), (analytic, numeric)


# ---------------------------------------------------------------- clip, against torch autograd

CLIP = 0.7


def _torch_forward(torch: Any, op: str, v: dict[str, Any], lbr: int) -> list[Any]:
    """One direction of ``op`` with ``clip`` (the ONNX equations), in torch: ``[Y, Y_h(, Y_c)]`` of one direction."""
    sig, tanh = torch.sigmoid, torch.tanh

    def cl(a: Any) -> Any:
        return torch.clamp(a, -CLIP, CLIP)

    w, r, (wb, rb), h = v["W"][0], v["R"][0], v["B"][0].chunk(2), v["h0"][0]
    c = v["c0"][0] if op == "LSTM" else None
    ys = []
    for x in v["X"]:
        if op == "RNN":
            h = tanh(cl(x @ w.T + h @ r.T + wb + rb))
        elif op == "GRU":
            (wz, wr, wh), (rz, rr, rh) = w.chunk(3), r.chunk(3)
            (bwz, bwr, bwh), (brz, brr, brh) = wb.chunk(3), rb.chunk(3)
            z = sig(cl(x @ wz.T + h @ rz.T + bwz + brz))
            reset = sig(cl(x @ wr.T + h @ rr.T + bwr + brr))
            recurrent = reset * (h @ rh.T + brh) if lbr else (reset * h) @ rh.T + brh
            h = (1 - z) * tanh(cl(x @ wh.T + recurrent + bwh)) + z * h
        else:
            a_i, a_o, a_f, a_g = (x @ w.T + h @ r.T + wb + rb).chunk(4, dim=-1)
            p_i, p_o, p_f = v["P"][0].chunk(3)
            i, f, g = sig(cl(a_i + p_i * c)), sig(cl(a_f + p_f * c)), tanh(cl(a_g))
            c = f * c + i * g
            h = sig(cl(a_o + p_o * c)) * tanh(c)
        ys.append(h)
    outputs = [torch.stack(ys)[:, None], h[None]]
    return [*outputs, c[None]] if c is not None else outputs


@pytest.mark.parametrize(("op", "lbr"), [("RNN", 0), ("GRU", 0), ("GRU", 1), ("LSTM", 0)])
def test_clip_gradients_match_torch_autograd(op: str, lbr: int) -> None:
    """``clip``: the activations see ``clip(a)``; ``d/da`` is 0 where ``|a| > clip`` (float64 torch reference)."""
    torch = pytest.importorskip("torch")
    steps, batch, size, hidden = 4, 3, 2, 3
    gates = specs_recurrent.GATES[op] * hidden
    shapes = {"X": (steps, batch, size), "W": (1, gates, size), "R": (1, gates, hidden), "B": (1, 2 * gates)}
    shapes["h0"] = (1, batch, hidden)
    shapes.update({"c0": (1, batch, hidden), "P": (1, 3 * hidden)} if op == "LSTM" else {})
    names = ["X", "W", "R", "B", "", "h0", *(["c0", "P"] if op == "LSTM" else [])]
    outputs = ["Y", "Y_h", *(["Y_c"] if op == "LSTM" else [])]
    attributes: dict[str, Any] = {"hidden_size": hidden, "clip": CLIP}
    attributes.update({"linear_before_reset": lbr} if op == "GRU" else {})
    node = helper.make_node(op, names, outputs, name="rec", **attributes)
    inputs = [
        helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, ["T", *s[1:]] if k == "X" else list(s))
        for k, s in shapes.items()
    ]
    model = helper.make_model(helper.make_graph([node], "g", inputs, []), opset_imports=[helper.make_opsetid("", 17)])
    session, projected = _projected_loss(model, outputs, list(shapes))
    rng = np.random.default_rng(7)
    values = {k: rng.normal(size=s) for k, s in shapes.items()}
    projections = [
        rng.normal(size=(steps, 1, batch, hidden)),
        *(rng.normal(size=(1, batch, hidden)) for _ in outputs[1:]),
    ]
    feeds = {k: v.astype(np.float32) for k, v in values.items()}
    feeds.update({c: p.astype(np.float32) for c, p in zip(projected, projections, strict=True)})
    got = session.run(None, feeds)
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in values.items()}
    ys = _torch_forward(torch, op, tensors, lbr)
    loss = sum((y * torch.from_numpy(p)).sum() for y, p in zip(ys, projections, strict=True))
    loss.backward()
    np.testing.assert_allclose(got[0], loss.item(), rtol=1e-5)
    for k, grad in zip(shapes, got[1:], strict=True):
        want = tensors[k].grad.numpy()
        np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=k)


# ---------------------------------------------------------------- refused attributes


def _one_node(op: str, **attributes: Any) -> tuple[GraphBuilder, str, list[str]]:
    gates = specs_recurrent.GATES[op] * 2
    inputs = [
        helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["T", 2, 3]),
        helper.make_tensor_value_info("W", onnx.TensorProto.FLOAT, [1, gates, 3]),
        helper.make_tensor_value_info("R", onnx.TensorProto.FLOAT, [1, gates, 2]),
    ]
    node = helper.make_node(op, ["X", "W", "R"], ["Y"], name="rec", hidden_size=2, **attributes)
    graph = helper.make_graph([node], "g", inputs, [])
    builder = GraphBuilder(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    loss = builder.add_node1("ReduceSum", ["Y"], keepdims=0)
    return builder, loss, ["X", "W", "R"]


@pytest.mark.parametrize(
    ("op", "attributes", "named"),
    [
        ("LSTM", {"clip": -1.0}, "clip=-1.0"),
        ("LSTM", {"input_forget": 1}, "input_forget=1"),
        ("GRU", {"activations": ["Sigmoid", "Relu"]}, "activations="),
        ("RNN", {"activations": ["Affine"]}, "activations="),
    ],
)
def test_unsupported_attributes_are_refused_by_name(op: str, attributes: dict[str, Any], named: str) -> None:
    builder, loss, wrt = _one_node(op, **attributes)
    with pytest.raises(ValueError, match=named) as error:
        build_gradients(builder, loss, wrt)
    assert "'rec'" in str(error.value)
