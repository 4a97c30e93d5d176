"""Gradients through If, Scan and Loop, beyond the one-node specs of ``specs_control_flow.py``.

- **torch autograd**: ``torch.jit.script``-ed modules exported by the TorchScript
  exporter: an ``If`` whose branch depends on the input (both branches), a
  recurrent cell looped over time (a ``Loop`` whose trip count is the input's
  length, two loop-carried states), and the cell in a ``while`` loop that stops
  early (a ``Loop`` with a condition computed by an ``If`` in its body, an
  integer state); trained through onnxtrain's training model, the loss and
  every parameter's gradient compared with torch's.
- **a Scan model** against torch: a recurrent cell over time as an ONNX ``Scan``
  (state, scan inputs read in reverse, a scan output), every gradient compared.
- **the forward graph**: the forward ``Loop``/``Scan`` saves only what the
  gradient reads, and is left as it was when no gradient goes through it.
- **errors**: an operator without a rule inside a body is named, with the loop.
"""

from __future__ import annotations

import functools
import io
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxtrain.autodiff import MissingGradientError, build_gradients, build_vjp, builtin_registry
from onnxtrain.graph import GraphBuilder
from onnxtrain.graph.walk import all_nodes
from tests.autodiff.models import Runner, training_block

OPSET = 17
HIDDEN, FEATURES, OUTPUTS = 5, 3, 2
LIMIT = 3  # the steps after which EarlyStop's loop stops


# ---------------------------------------------------------------- torch models


def _torch_modules() -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Gated(nn.Module):
        """``fc2(h)`` when the input's mean is positive, else ``2 * alt(sin(h))``; ``h = tanh(fc1(x))``."""

        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(4, 6)
            self.fc2 = nn.Linear(6, OUTPUTS)
            self.alt = nn.Linear(6, OUTPUTS)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.tanh(self.fc1(x))
            if bool(x.mean() > 0):  # scripted: exported as an If
                return self.fc2(h)
            return self.alt(torch.sin(h)) * 2.0

    class Recurrent(nn.Module):
        """``h_t = tanh(inp(x_t) + rec(h_{t-1}))`` over time, ``acc = sum_t h_t``; ``head(h_T + acc)``."""

        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(FEATURES, HIDDEN)
            self.rec = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.head = nn.Linear(HIDDEN, OUTPUTS)
            self.hidden = HIDDEN

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.zeros(x.shape[0], self.hidden, dtype=x.dtype)
            acc = torch.zeros(x.shape[0], self.hidden, dtype=x.dtype)
            for t in range(x.shape[1]):
                h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
                acc = acc + h
            return self.head(h + acc)

    class EarlyStop(nn.Module):
        """``Recurrent``'s cell in a ``while`` loop that stops after ``limit`` steps or at the input's end."""

        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(FEATURES, HIDDEN)
            self.rec = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.head = nn.Linear(HIDDEN, OUTPUTS)
            self.hidden = HIDDEN
            self.limit = LIMIT

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.zeros(x.shape[0], self.hidden, dtype=x.dtype)
            t = 0
            while t < x.shape[1] and t < self.limit:  # exported: a Loop whose condition is an If in the body
                h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
                t += 1
            return self.head(h)

    return {"gated": Gated, "recurrent": Recurrent, "early_stop": EarlyStop}


@functools.cache
def _exported(name: str) -> tuple[Any, onnx.ModelProto]:
    """The scripted module and its export (symbolic batch, and time for the recurrent model)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's deprecation notice
        module = torch.jit.script(_torch_modules()[name]())
    example = torch.randn(3, 4) if name == "gated" else torch.randn(3, 2, FEATURES)
    axes = {0: "batch"} if name == "gated" else {0: "batch", 1: "time"}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            (example,),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            do_constant_folding=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": axes, "y": {0: "batch"}},
        )
    return module, onnx.load_from_string(buffer.getvalue())


@functools.cache
def _training(name: str) -> tuple[onnx.ModelProto, Runner, tuple[str, ...]]:
    module, model = _exported(name)
    op = {"gated": "If", "recurrent": "Loop", "early_stop": "Loop"}[name]
    assert any(node.op_type == op for node in model.graph.node), f"the export has no {op}"
    trainable = tuple(k for k, _ in module.named_parameters())
    # EarlyStop's loop body holds an If that reads a value of the main graph: the training model's pruning
    # keeps the outer values that subgraphs read at any depth
    training = training_block(model, "mse", trainable).gradient_models.training
    return training, Runner(training), trainable


def _data(name: str, batch: int, steps: int, sign: float, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (batch, 4) if name == "gated" else (batch, steps, FEATURES)
    x = (rng.normal(size=shape) + sign).astype(np.float32)
    return {"x": x, "target": rng.normal(size=(batch, OUTPUTS)).astype(np.float32)}


@pytest.mark.parametrize(
    ("name", "batch", "steps", "sign"),
    [
        ("gated", 4, 0, 2.0),  # then branch
        ("gated", 4, 0, -2.0),  # else branch
        ("gated", 1, 0, 2.0),
        ("recurrent", 3, 1, 0.0),
        ("recurrent", 2, 4, 0.0),
        ("recurrent", 5, 7, 0.0),
        ("early_stop", 3, 2, 0.0),  # stops at the input's end
        ("early_stop", 2, 6, 0.0),  # stops after LIMIT steps
    ],
)
def test_gradients_match_torch_autograd(name: str, batch: int, steps: int, sign: float) -> None:
    """Loss and every parameter's gradient of the exported, scripted module equal torch's."""
    torch = pytest.importorskip("torch")
    module, _ = _exported(name)
    training, runner, trainable = _training(name)
    assert all(node.domain in ("", "ai.onnx") for node in all_nodes(training.graph)), "only standard operators"
    data = _data(name, batch, steps, sign, seed=batch * 10 + steps)
    params = {k: v.detach().numpy().copy() for k, v in module.named_parameters()}
    inputs = [value.name for value in training.graph.input]
    out = runner({k: {**data, **params}[k] for k in inputs})
    module.zero_grad(set_to_none=True)
    y = module(torch.from_numpy(data["x"]))
    loss = torch.nn.functional.mse_loss(y, torch.from_numpy(data["target"]))
    loss.backward()
    np.testing.assert_allclose(out[training.graph.output[0].name], loss.item(), rtol=1e-5)
    for param, tensor in module.named_parameters():
        want = tensor.grad.numpy() if tensor.grad is not None else np.zeros(tensor.shape, np.float32)
        got = out[f"{param}_grad"]
        assert got.shape == want.shape, f"{param}_grad: {got.shape}, torch {want.shape}"
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(want).max())), err_msg=f"{name}: {param}"
        )
    assert set(trainable) == set(params)


def test_the_branch_not_taken_gives_zero_gradients() -> None:
    """``alt`` is read only by the else branch: its gradient is zero when the then branch runs, and not otherwise."""
    module, _ = _exported("gated")
    training, runner, _ = _training("gated")
    params = {k: v.detach().numpy().copy() for k, v in module.named_parameters()}
    inputs = [value.name for value in training.graph.input]
    for sign, zero, nonzero in ((2.0, "alt", "fc2"), (-2.0, "fc2", "alt")):
        feeds = {**_data("gated", 3, 0, sign, seed=1), **params}
        out = runner({k: feeds[k] for k in inputs})
        for suffix in ("weight", "bias"):
            assert not np.any(out[f"{zero}.{suffix}_grad"]), f"{zero}.{suffix} in the branch not taken"
            assert np.any(out[f"{nonzero}.{suffix}_grad"])


# ---------------------------------------------------------------- a Scan model against torch


def _scan_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``h_t = tanh(x_t W^T + h_{t-1} R^T + b)`` over the time-major ``x`` read in reverse; ``y_t = h_t V^T``;
    ``loss = mean(y^2) + sum(h_T * c)``, float64."""
    rng = np.random.default_rng(3)
    params = {
        "W": rng.uniform(-0.6, 0.6, (HIDDEN, FEATURES)),
        "R": rng.uniform(-0.6, 0.6, (HIDDEN, HIDDEN)),
        "b": rng.uniform(-0.6, 0.6, HIDDEN),
        "V": rng.uniform(-0.6, 0.6, (OUTPUTS, HIDDEN)),
        "h0": rng.uniform(-0.6, 0.6, (1, HIDDEN)),
    }
    d = TensorProto.DOUBLE
    body = helper.make_graph(
        [
            helper.make_node("Gemm", ["x_t", "W", "b"], ["xw"], transB=1),
            helper.make_node("Gemm", ["h", "R"], ["hr"], transB=1),
            helper.make_node("Add", ["xw", "hr"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_next"]),
            helper.make_node("Gemm", ["h_next", "V"], ["y_t"], transB=1),
        ],
        "cell",
        [
            helper.make_tensor_value_info("h", d, ["batch", HIDDEN]),
            helper.make_tensor_value_info("x_t", d, ["batch", FEATURES]),
        ],
        [
            helper.make_tensor_value_info("h_next", d, ["batch", HIDDEN]),
            helper.make_tensor_value_info("y_t", d, ["batch", OUTPUTS]),
        ],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], start=1, end=2),
        helper.make_node("Concat", ["x_shape", "hidden"], ["h_shape"], axis=0),
        helper.make_node("Expand", ["h0", "h_shape"], ["h_init"]),
        helper.make_node(
            "Scan", ["h_init", "x"], ["h_last", "ys"], body=body, num_scan_inputs=1, scan_input_directions=[1]
        ),
        helper.make_node("Mul", ["ys", "ys"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["l1"], keepdims=0),
        helper.make_node("Mul", ["h_last", "c"], ["hc"]),
        helper.make_node("ReduceSum", ["hc"], ["l2"], keepdims=0),
        helper.make_node("Add", ["l1", "l2"], ["loss"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scan_rnn",
        [
            helper.make_tensor_value_info("x", d, ["time", "batch", FEATURES]),
            helper.make_tensor_value_info("c", d, ["batch", HIDDEN]),
        ],
        [],
        [onnx.numpy_helper.from_array(v, k) for k, v in params.items()]
        + [onnx.numpy_helper.from_array(np.array([HIDDEN], np.int64), "hidden")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), params


@pytest.mark.parametrize(("steps", "batch"), [(1, 2), (4, 3), (6, 1)])
def test_scan_model_matches_torch_autograd(steps: int, batch: int) -> None:
    torch = pytest.importorskip("torch")
    model, params = _scan_model()
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", list(params))
    builder.set_outputs(["loss", *(grads[k] for k in params)])
    runner = Runner(builder.finalize())
    rng = np.random.default_rng(steps)
    x, c = rng.normal(size=(steps, batch, FEATURES)), rng.normal(size=(batch, HIDDEN))
    out = runner({"x": x, "c": c})
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    h = tensors["h0"].expand(batch, HIDDEN)
    ys = [torch.zeros(0)] * steps
    for t in reversed(range(steps)):
        h = torch.tanh(torch.from_numpy(x[t]) @ tensors["W"].T + h @ tensors["R"].T + tensors["b"])
        ys[steps - 1 - t] = h @ tensors["V"].T
    loss = (torch.stack(ys) ** 2).mean() + (h * torch.from_numpy(c)).sum()
    loss.backward()
    np.testing.assert_allclose(out["loss"], loss.item(), rtol=1e-12)
    for k, tensor in tensors.items():
        np.testing.assert_allclose(out[f"{k}_grad"], tensor.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


# ---------------------------------------------------------------- the forward graph


def _loop_model(read_by_loss: bool) -> onnx.ModelProto:
    """``v_{t+1} = tanh(v_t * w)`` from ``v_0 = Identity(v0)``, ``M`` times, a scan output ``sin(v)``;
    ``loss = sum(u * sum(zs))`` (or ``sum(u * sum(v0))``, which no gradient through the loop reaches)."""
    d = TensorProto.DOUBLE
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond"], ["cond_out"]),
            helper.make_node("Mul", ["v", "w"], ["vw"]),
            helper.make_node("Tanh", ["vw"], ["v_next"]),
            helper.make_node("Sin", ["v_next"], ["z"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", d, [3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_next", d, [3]),
            helper.make_tensor_value_info("z", d, [3]),
        ],
    )
    nodes = [
        helper.make_node("Identity", ["v0"], ["v_start"]),
        helper.make_node("Loop", ["M", "", "v_start"], ["v_last", "zs"], body=body),
        helper.make_node("ReduceSum", ["zs" if read_by_loss else "v0"], ["s"], keepdims=0),
        helper.make_node("Mul", ["s", "u"], ["su"]),
        helper.make_node("ReduceSum", ["su"], ["loss"], keepdims=0),
    ]
    inputs = [
        helper.make_tensor_value_info("M", TensorProto.INT64, []),
        *(helper.make_tensor_value_info(name, d, [3]) for name in ("v0", "w", "u")),
    ]
    return helper.make_model(
        helper.make_graph(nodes, "loop", inputs, []), opset_imports=[helper.make_opsetid("", OPSET)]
    )


def _loop_node(builder: GraphBuilder) -> onnx.NodeProto:
    return next(node for node in builder.model.graph.node if node.op_type == "Loop")


def test_the_forward_loop_saves_its_iterations_and_the_states_the_gradient_reads() -> None:
    builder = GraphBuilder(_loop_model(read_by_loss=True))
    grads = build_gradients(builder, "loss", ["w", "v0"])
    loop = _loop_node(builder)
    body = loop.attribute[0].g
    assert len(loop.output) == 4, "v_last, zs, then the saved iteration numbers and states v"
    saved = {node.input[0] for node in body.node[-2:]}
    assert saved == {"i", "v"}
    builder.set_outputs(["loss", grads["w"], loop.output[2], loop.output[3]])
    runner = Runner(builder.finalize())
    rng = np.random.default_rng(0)
    feeds = {"M": np.array(3), **{k: rng.normal(size=3) for k in ("v0", "w", "u")}}
    out = runner(feeds, [loop.output[2], loop.output[3]])
    np.testing.assert_array_equal(out[loop.output[2]], [0, 1, 2])
    assert out[loop.output[3]].shape == (3, 3)


def test_a_loop_the_gradient_does_not_go_through_is_left_as_it_was() -> None:
    model = _loop_model(read_by_loss=False)
    builder = GraphBuilder(model)
    build_gradients(builder, "loss", ["w", "u"])
    loop = _loop_node(builder)
    assert loop == model.graph.node[1]


def test_a_failed_build_puts_the_forward_loop_back() -> None:
    """A rule fails after the Loop's rule rewrote its node: the node gets its body and outputs back."""
    model = _loop_model(read_by_loss=True)
    registry = builtin_registry().copy()

    @registry.rule("Identity", replace=True)
    def wrong(ctx: Any, grads: Any) -> list[str | None]:
        return ["no_such_value"]

    builder = GraphBuilder(model)
    with pytest.raises(TypeError, match="no_such_value"):
        build_gradients(builder, "loss", ["v0"], registry=registry)
    assert builder.model.graph == model.graph


def test_an_operator_without_a_rule_inside_a_body_is_named_with_its_loop() -> None:
    registry = builtin_registry().copy()
    model = _loop_model(read_by_loss=True)
    for node in model.graph.node[1].attribute[0].g.node:
        if node.op_type == "Tanh":
            node.op_type, node.domain = "Cube", "custom"
    model.opset_import.append(helper.make_opsetid("custom", 1))
    with pytest.raises(MissingGradientError, match=r"in a subgraph of Loop.*Cube"):
        build_gradients(GraphBuilder(model), "loss", ["w"], registry=registry)


def test_a_sequence_carried_by_a_loop_is_refused_with_a_clear_error() -> None:
    """A loop appending to a sequence (what a scripted loop appending to a list exports): no gradient through
    it, and the error says so."""
    d = TensorProto.DOUBLE
    sequence = helper.make_tensor_sequence_value_info
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond"], ["cond_out"]),
            helper.make_node("Mul", ["w", "w"], ["ww"]),
            helper.make_node("SequenceInsert", ["seq", "ww"], ["seq_next"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            sequence("seq", d, [3]),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), sequence("seq_next", d, [3])],
    )
    nodes = [
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=d),
        helper.make_node("Loop", ["M", "", "empty"], ["seq_last"], body=body),
        helper.make_node("SequenceAt", ["seq_last", "zero"], ["first"]),
        helper.make_node("ReduceSum", ["first"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "collect",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []), helper.make_tensor_value_info("w", d, [3])],
        [],
        [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(ValueError, match=r"cannot differentiate Loop through the loop-carried value 'seq' of type seq"):
        build_gradients(GraphBuilder(model), "loss", ["w"])


# ---------------------------------------------------------------- engine support


def _if_model() -> onnx.ModelProto:
    """``y = If(c, sin(x * w), x * x)``; ``loss = sum(y * x)``."""
    d = TensorProto.DOUBLE
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Sin", ["xw"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", d, [2, 3])],
    )
    otherwise = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", d, [2, 3])]
    )
    nodes = [
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=otherwise),
        helper.make_node("Mul", ["y", "x"], ["yx"]),
        helper.make_node("ReduceSum", ["yx"], ["loss"], keepdims=0),
    ]
    inputs = [helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    inputs += [helper.make_tensor_value_info(name, d, [2, 3]) for name in ("x", "w")]
    return helper.make_model(helper.make_graph(nodes, "if", inputs, []), opset_imports=[helper.make_opsetid("", OPSET)])


@pytest.mark.parametrize("condition", [True, False])
def test_if_gradients_with_the_if_output_among_wrt(condition: bool) -> None:
    """``y`` in ``wrt`` too: its gradient is renamed ``y_grad``, and the gradient branches that read it follow."""
    builder = GraphBuilder(_if_model())
    grads = build_gradients(builder, "loss", ["x", "w", "y"])
    builder.set_outputs(["loss", grads["x"], grads["w"], grads["y"]])
    runner = Runner(builder.finalize())
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    out = runner({"c": np.array(condition), "x": x, "w": w})
    np.testing.assert_allclose(out["y_grad"], x)
    if condition:
        np.testing.assert_allclose(out["x_grad"], np.sin(x * w) + x * np.cos(x * w) * w)
        np.testing.assert_allclose(out["w_grad"], x * np.cos(x * w) * x)
    else:
        np.testing.assert_allclose(out["x_grad"], 3 * x * x)
        np.testing.assert_array_equal(out["w_grad"], np.zeros((2, 3)))


def test_build_vjp_seeds_several_outputs_and_gives_none_where_independent() -> None:
    d = TensorProto.DOUBLE
    nodes = [helper.make_node("Mul", ["x", "w"], ["y1"]), helper.make_node("Sin", ["x"], ["y2"])]
    inputs = [helper.make_tensor_value_info(name, d, [3]) for name in ("x", "w", "u", "g1", "g2")]
    model = helper.make_model(helper.make_graph(nodes, "vjp", inputs, []), opset_imports=[helper.make_opsetid("", 17)])
    builder = GraphBuilder(model)
    grads = build_vjp(builder, {"y1": "g1", "y2": "g2"}, ["x", "w", "u"])
    assert grads["u"] is None
    builder.set_outputs([grads["x"], grads["w"]])  # type: ignore[list-item]
    rng = np.random.default_rng(5)
    feeds = {name: rng.normal(size=3) for name in ("x", "w", "u", "g1", "g2")}
    dx, dw = Runner(builder.finalize())(feeds).values()
    np.testing.assert_allclose(dx, feeds["g1"] * feeds["w"] + feeds["g2"] * np.cos(feeds["x"]))
    np.testing.assert_allclose(dw, feeds["g1"] * feeds["x"])
    builder = GraphBuilder(model)
    cast = builder.add_node1("Cast", ["g1"], to=TensorProto.FLOAT)
    with pytest.raises(ValueError, match=r"cotangent .* is float, the value double"):
        build_vjp(builder, {"y1": cast}, ["x"])


@pytest.mark.parametrize("name", ["gated", "recurrent"])
def test_artifacts_train_a_model_with_control_flow(name: str, tmp_path: Any) -> None:
    """generate_artifacts, then ONNX Runtime's training API (onnxtrain.api): AdamW steps lower the loss, and the
    eval model (the forward Loop or If without its saved outputs) gives the loss of the trained parameters."""
    from onnxtrain import api
    from onnxtrain.artifacts import generate_artifacts

    module, model = _exported(name)
    generate_artifacts(
        model,
        requires_grad=[k for k, _ in module.named_parameters()],
        loss="MSELoss",
        optimizer="AdamW",
        artifact_directory=tmp_path,
    )
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    trained = api.Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    optimizer = api.Optimizer(str(tmp_path / "optimizer_model.onnx"), trained)
    data = _data(name, 4, 5, 2.0, seed=0)
    losses = []
    for _ in range(20):
        trained.train()
        losses.append(float(trained(data["x"], data["target"])))
        optimizer.step()
        trained.lazy_reset_grad()
    trained.eval()
    evaluated = float(trained(data["x"], data["target"]))
    assert losses[-1] < 0.9 * losses[0], losses
    assert evaluated < losses[-1]  # one more step's worth of training, same data
    eval_model = onnx.load(str(tmp_path / "eval_model.onnx"))
    forward = next(node for node in eval_model.graph.node if node.op_type in ("If", "Loop"))
    assert len(forward.output) == 1 + (name == "recurrent"), "the eval model's node saves nothing"


def _squeeze_if_one(declared: list[str]) -> onnx.ModelProto:
    """TorchScript's ``y.squeeze(1)`` of a size it cannot tell: ``If(shape(y)[1] == 1, Squeeze(y, 1), y)``, each
    branch's output declared at its rank, the ``If``'s ``declared`` (the exporter's: one branch's rank);
    ``y = x @ w``, ``loss = sum(out * out)``."""
    d = TensorProto.DOUBLE
    then = helper.make_graph(
        [helper.make_node("Squeeze", ["y", "axis"], ["squeezed"])], "then", [],
        [helper.make_tensor_value_info("squeezed", d, ["B"])],
    )  # fmt: skip
    otherwise = helper.make_graph(
        [helper.make_node("Identity", ["y"], ["kept"])],
        "else",
        [],
        [helper.make_tensor_value_info("kept", d, ["B", "K"])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Shape", ["y"], ["size"], start=1, end=2),
        helper.make_node("Equal", ["size", "axis"], ["one"]),
        helper.make_node("Squeeze", ["one"], ["cond"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=otherwise),
        helper.make_node("Mul", ["out", "out"], ["squared"]),
        helper.make_node("ReduceSum", ["squared"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "squeeze_if_one",
        [helper.make_tensor_value_info("x", d, ["B", 4]), helper.make_tensor_value_info("w", d, [4, "K"])],
        [helper.make_tensor_value_info("out", d, declared)],
        [onnx.numpy_helper.from_array(np.array([1], np.int64), "axis")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


@pytest.mark.parametrize(
    ("columns", "declared"),
    [(1, ["B"]), (1, ["B", "K"]), (3, ["B", "K"])],
    ids=["squeezed-declared-so", "squeezed-declared-kept", "kept-declared-so"],
)
def test_an_if_whose_branches_give_different_ranks(columns: int, declared: list[str]) -> None:
    """The branch's gradient is the If's, shaped as the branch's output: the build failed ("a gradient of shape
    [?] for ... of shape [B, 1]"), on TorchScript exports of DLRM (``.squeeze(1)`` of scores whose axis 1 is 1).
    Not covered: the branch that runs giving another rank than the If's declared one (the model's declaration
    wrong at run time), where onnxruntime plans the buffers of the backward's ``Shape`` from it."""
    builder = GraphBuilder(_squeeze_if_one(declared))
    grads = build_gradients(builder, "loss", ["w"])
    builder.set_outputs(["loss", grads["w"]])
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(6, 4)), rng.normal(size=(4, columns))
    out = Runner(builder.finalize())({"x": x, "w": w})
    np.testing.assert_allclose(out["loss"], np.sum((x @ w) ** 2))
    np.testing.assert_allclose(out["w_grad"], 2 * x.T @ (x @ w), rtol=1e-12)


@pytest.mark.parametrize("ranked", [True, False], ids=["inputs-ranked", "input-unranked"])
def test_a_rank_a_rule_needs_and_inference_lost_says_where_it_was_lost(ranked: bool) -> None:
    """The advice was to give the inputs a known rank, also where they had one (nn.EmbeddingBag's dynamo export,
    a bag built as a sequence in a Loop): an unranked input is named; else the sequence is said to lose it."""
    d = TensorProto.DOUBLE
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=d),
        helper.make_node("SequenceInsert", ["empty", "h"], ["bag"]),
        helper.make_node("ConcatFromSequence", ["bag"], ["y"], "concat", axis=1),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    x = helper.make_tensor_value_info("x", d, ["B", 3] if ranked else None)
    graph = helper.make_graph(nodes, "bag", [x], [], [onnx.numpy_helper.from_array(np.ones(3), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    said = "the inputs' ranks are known, and shape inference loses it" if ranked else r"give the model's inputs \['x'\]"
    with pytest.raises(ValueError, match=rf"ConcatFromSequence node 'concat' needs the rank of 'y'.*{said}"):
        build_gradients(GraphBuilder(model), "loss", ["w"])
