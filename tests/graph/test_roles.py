"""Which initializers are weights, constants and running statistics, read from how the graph uses them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain.artifacts import initializer_roles, trainable_parameters
from tests.helpers import BOOL, FLOAT, INT64, export_for_training, make_model


def sinusoids(positions: int, width: int, *, halves: bool = False) -> np.ndarray:
    """The Transformer's fixed position encoding, float32 ``[positions, width]``: ``sin(p w_i)`` in the even
    columns and ``cos(p w_i)`` in the odd ones (``halves``: the sines first, then the cosines)."""
    angles = np.arange(positions)[:, None] * np.exp(np.arange(0, width, 2) * (-np.log(10000.0) / width))[None]
    if halves:
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)
    table = np.zeros((positions, width), np.float32)
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table


def test_a_table_of_sines_and_cosines_is_told_by_its_values():
    """Interleaved or in halves, float32 or float16, up to 8,192 positions; not a learned table, zeros, ones, a
    slice of columns that holds no cosine, or a table scaled past 1."""
    from onnxtrain.graph.encodings import is_sinusoidal

    rng = np.random.default_rng(0)
    assert is_sinusoidal(sinusoids(16, 4)) and is_sinusoidal(sinusoids(64, 8, halves=True)[:, None])
    assert is_sinusoidal(sinusoids(8192, 1024)) and is_sinusoidal(sinusoids(512, 64).astype(np.float16))
    noisy = sinusoids(16, 4) + rng.normal(size=(16, 4)) * 1e-3
    for table in (rng.normal(size=(16, 4)) * 0.02, np.zeros((16, 4)), np.ones((16, 4)), sinusoids(16, 8)[:, 0::2],
                  2 * sinusoids(16, 4), noisy.astype(np.float32), sinusoids(2, 4)):  # fmt: skip
        assert not is_sinusoidal(table)


def test_a_mask_sliced_and_added_to_attention_scores_is_a_constant_where_a_learned_bias_is_a_weight():
    """``scores + self.mask[:T, :T]`` (zeros and -inf, or -1e4) as a TorchScript export writes it: a buffer; a
    learned bias sliced alike and added to the same product: a weight."""
    from onnxtrain.graph.encodings import is_mask

    f32 = np.float32
    causal = np.triu(np.full((8, 8), -np.inf, f32), 1)
    assert is_mask(causal) and is_mask(np.where(np.isinf(causal), -1e4, 0).astype(f32))
    assert not is_mask(np.zeros((8, 8))) and not is_mask(np.triu(np.full((8, 8), -1.0), 1))
    rng = np.random.default_rng(0)
    initializers = [
        ("q", rng.normal(size=(4, 4)).astype(f32)),
        ("mask", causal),
        ("bias", rng.normal(size=(8, 8)).astype(f32) * 0.02),
        ("zero", np.array([0, 0], np.int64)),
        ("size", np.array([2, 2], np.int64)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "q"], ["xq"]),  # [2, 4]
        helper.make_node("Transpose", ["xq"], ["xq_t"]),
        helper.make_node("MatMul", ["xq", "xq_t"], ["scores"]),  # [2, 2]
        helper.make_node("Slice", ["mask", "zero", "size"], ["mask_rows"]),
        helper.make_node("Add", ["scores", "mask_rows"], ["masked"]),
        helper.make_node("Slice", ["bias", "zero", "size"], ["bias_rows"]),
        helper.make_node("Add", ["masked", "bias_rows"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, [2, 4])}, nodes, {"y": (FLOAT, [2, 2])}, initializers)
    assert trainable_parameters(model) == ["q", "bias"]


def _graph_of_every_use() -> onnx.ModelProto:
    """One model reading initializers in each way the roles distinguish."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    initializers = [
        ("linear.weight", rng.normal(size=(3, 4)).astype(f32)),  # read through Transpose by MatMul: a weight
        ("linear.bias", np.zeros(3, f32)),  # added to a MatMul's output: a weight
        ("head.bias", np.zeros(1, f32)),  # a bias of one element is still a weight (rank 1)
        ("scale", np.array(0.5, f32)),  # rank 0, multiplying: a constant
        ("fill", np.array(-3.4e38, f32)),  # Where's fill value: a constant
        ("ratio", np.array(0.1, f32)),  # Dropout's ratio: a constant
        ("bn.weight", np.ones(3, f32)),
        ("bn.bias", np.zeros(3, f32)),
        ("bn.running_mean", np.zeros(3, f32)),
        ("bn.running_var", np.ones(3, f32)),
        ("table", rng.normal(size=(10, 3)).astype(f32)),  # an embedding (Gather's data): a weight
        ("positions", np.arange(2, dtype=np.int64)),  # integers: a constant
        ("frequencies", np.ones(3, f32)),  # read only by Unsqueeze: a constant
        ("offset", np.ones(3, f32)),  # added to another constant: a constant
    ]
    nodes = [
        helper.make_node("Transpose", ["linear.weight"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["xw"]),
        helper.make_node("Add", ["xw", "linear.bias"], ["h"]),
        helper.make_node("Mul", ["h", "scale"], ["hs"]),
        helper.make_node("Greater", ["hs", "h"], ["mask"]),
        helper.make_node("Where", ["mask", "fill", "hs"], ["masked"]),
        helper.make_node("Dropout", ["masked", "ratio"], ["dropped"]),
        helper.make_node("Unsqueeze", ["dropped", "one"], ["four_d"]),
        helper.make_node(
            "BatchNormalization",
            ["four_d", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            ["normed"],
        ),
        helper.make_node("Squeeze", ["normed", "one"], ["flat"]),
        helper.make_node("Gather", ["table", "positions"], ["embedded"]),
        helper.make_node("ReduceSum", ["embedded"], ["pooled"], keepdims=0),
        helper.make_node("Add", ["frequencies", "offset"], ["shifted"]),
        helper.make_node("Unsqueeze", ["shifted", "zero"], ["row"]),
        helper.make_node("Add", ["flat", "row"], ["y0"]),
        helper.make_node("Add", ["y0", "pooled"], ["y1"]),
        helper.make_node("ReduceSum", ["y1", "last"], ["y2"], keepdims=1),
        helper.make_node("Add", ["y2", "head.bias"], ["y"]),
    ]
    initializers += [("one", np.array([2], np.int64)), ("zero", np.array([0], np.int64))]
    initializers += [("last", np.array([1], np.int64))]
    return make_model({"x": (FLOAT, ["batch", 4])}, nodes, {"y": (FLOAT, ["batch", 1])}, initializers, opset=15)


def test_each_use_gives_its_role():
    roles = initializer_roles(_graph_of_every_use())
    assert roles == {
        "linear.weight": "weight",
        "linear.bias": "weight",
        "head.bias": "weight",
        "scale": "constant",
        "fill": "constant",
        "ratio": "constant",
        "bn.weight": "weight",
        "bn.bias": "weight",
        "bn.running_mean": "running statistic",
        "bn.running_var": "running statistic",
        "table": "weight",
        "positions": "constant",
        "frequencies": "constant",
        "offset": "constant",
        "one": "constant",
        "zero": "constant",
        "last": "constant",
    }
    assert trainable_parameters(_graph_of_every_use()) == [
        "linear.weight", "linear.bias", "head.bias", "bn.weight", "bn.bias", "table",
    ]  # fmt: skip


def test_a_path_is_read_without_its_external_data(tmp_path):
    model = _graph_of_every_use()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()  # the roles need names, types and the graph only
    assert initializer_roles(tmp_path / "m.onnx") == initializer_roles(model)


def test_an_initializer_used_both_as_weight_and_otherwise_is_a_weight():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Shape", ["w"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=FLOAT),
        helper.make_node("Add", ["xw", "sf"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, ["n", 2])}, nodes, {"y": (FLOAT, ["n", 2])}, [("w", np.ones((2, 2), np.float32))])
    assert initializer_roles(model) == {"w": "weight"}


def test_a_table_looked_up_by_gather_nd_is_a_weight():
    """torch's dynamo exporter, optimizing Whisper, reads the decoder's position table through ``GatherND``; as
    a constant it was left out of the trainable parameters, frozen where torch trains it."""
    nodes = [helper.make_node("GatherND", ["table", "positions"], ["y"])]
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    model = make_model({"positions": (INT64, ["n", 1])}, nodes, {"y": (FLOAT, ["n", 2])}, [("table", table)])
    assert initializer_roles(model) == {"table": "weight"}


def test_a_tensor_an_output_is_computed_from_alone_is_a_weight():
    """A Gaussian policy's log standard deviation reaches its output through nothing the inputs compute (their
    shapes apart): expanded to the mean's shape and exponentiated (CleanRL), times ``ones_like(mean)``
    (stable-baselines3), or output as it is. It was classed a constant and frozen without a word. An output
    computed from two tensors, or from one and the data, is left to the other rules."""
    f32 = np.float32
    initializers = [
        ("w", np.ones((4, 2), f32)),
        ("log_std", np.zeros((1, 2), f32)),  # exp(expand(log_std, shape(mean))): a weight
        ("sb3_log_std", np.zeros(2, f32)),  # ones_like(mean) * exp(log_std): a weight
        ("log_vars", np.zeros(3, f32)),  # output as it is (a multi-task loss's learned weights): a weight
        ("c1", np.ones(2, f32)),  # c1 + c2: two tensors, neither alone: constants
        ("c2", np.ones(2, f32)),
        ("mean", np.zeros(4, f32)),  # x - mean: beside the data, a constant as before
    ]
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("MatMul", ["centred", "w"], ["mu"]),
        helper.make_node("Shape", ["mu"], ["shape"]),
        helper.make_node("Expand", ["log_std", "shape"], ["expanded"]),
        helper.make_node("Exp", ["expanded"], ["std"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=helper.make_tensor("one", FLOAT, [1], [1])),
        helper.make_node("Exp", ["sb3_log_std"], ["sb3_exp"]),
        helper.make_node("Mul", ["ones", "sb3_exp"], ["sb3_std"]),
        helper.make_node("Identity", ["log_vars"], ["task_weights"]),
        helper.make_node("Add", ["c1", "c2"], ["both"]),
    ]
    outputs = {
        "mu": (FLOAT, ["n", 2]),
        "std": (FLOAT, ["n", 2]),
        "sb3_std": (FLOAT, ["n", 2]),
        "task_weights": (FLOAT, [3]),
        "both": (FLOAT, [2]),
    }
    model = make_model({"x": (FLOAT, ["n", 4])}, nodes, outputs, initializers)
    assert trainable_parameters(model) == ["w", "log_std", "sb3_log_std", "log_vars"]


def test_tensorflows_batch_norm_shift_minus_what_weights_compute_is_a_weight():
    """tf2onnx writes a training-mode batch normalization as ``h * scale + (beta - mean * scale)``, ``scale``
    gamma times the batch's ``1 / sqrt(var + eps)``: beta, the minuend, was a constant and was frozen. A
    single-element minuend (a converted classifier's ``1 - p``) stays a constant."""
    f32 = np.float32
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["mean"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["h", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "centred"], ["squares"]),
        helper.make_node("ReduceMean", ["squares"], ["variance"], axes=[0], keepdims=1),
        helper.make_node("Add", ["variance", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["deviation"]),
        helper.make_node("Reciprocal", ["deviation"], ["rsqrt"]),
        helper.make_node("Mul", ["gamma", "rsqrt"], ["scale"]),
        helper.make_node("Mul", ["h", "scale"], ["scaled"]),
        helper.make_node("Mul", ["mean", "scale"], ["shifted_mean"]),
        helper.make_node("Sub", ["beta", "shifted_mean"], ["shift"]),
        helper.make_node("Add", ["scaled", "shift"], ["normed"]),
        helper.make_node("MatMul", ["normed", "w"], ["p"]),
        helper.make_node("Sub", ["unity", "p"], ["y"]),
    ]
    initializers = [
        ("w0", np.ones((3, 4), f32)),
        ("eps", np.array(1e-3, f32)),
        ("gamma", np.ones(4, f32)),
        ("beta", np.zeros(4, f32)),
        ("w", np.ones((4, 1), f32)),
        ("unity", np.ones(1, f32)),
    ]
    model = make_model({"x": (FLOAT, ["n", 3])}, nodes, {"y": (FLOAT, ["n", 1])}, initializers, opset=13)
    assert trainable_parameters(model) == ["w0", "gamma", "beta", "w"]


@pytest.mark.parametrize("form", ["cleanrl", "stable-baselines3", "as it is"])
def test_a_gaussian_policys_log_std_exported_by_torch_is_a_weight(form):
    torch = pytest.importorskip("torch")

    class GaussianPolicy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mu = torch.nn.Linear(4, 2)
            self.log_std = torch.nn.Parameter(torch.zeros(1, 2))

        def forward(self, obs):
            mu = self.mu(obs)
            if form == "cleanrl":
                return mu, torch.exp(self.log_std.expand_as(mu))
            if form == "stable-baselines3":
                return mu, torch.ones_like(mu) * self.log_std.exp()
            return mu, self.log_std

    model = export_for_training(GaussianPolicy(), (torch.randn(3, 4),), ["obs"], ["mu", "std"], opset=17)
    assert sorted(trainable_parameters(model)) == ["log_std", "mu.bias", "mu.weight"]


def test_integer_tensors_are_never_weights():
    nodes = [helper.make_node("Gather", ["table", "x"], ["y"])]
    model = make_model({"x": (INT64, ["n"])}, nodes, {"y": (INT64, ["n"])}, [("table", np.arange(5, dtype=np.int64))])
    assert initializer_roles(model) == {"table": "constant"}


def _torch_exports():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class ConvNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)
            self.drop = torch.nn.Dropout(0.1)
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).mean((2, 3)))

    torch.manual_seed(0)
    config = transformers.DistilBertConfig(
        vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=16
    )
    bert = transformers.DistilBertForSequenceClassification(config).train()
    ids = torch.randint(0, 50, (2, 5))
    conv = ConvNet().train()
    return [
        (conv, export_for_training(conv, (torch.randn(2, 3, 6, 6),), ["x"], ["y"], opset=17)),
        (bert, export_for_training(bert, (ids, torch.ones_like(ids)), ["ids", "mask"], ["logits"], opset=17)),
    ]


def test_the_weights_of_torch_exports_are_its_parameters_and_the_buffers_are_statistics():
    for module, model in _torch_exports():
        roles = initializer_roles(model)
        parameters = [name for name, _ in module.named_parameters()]
        assert sorted(trainable_parameters(model)) == sorted(parameters)
        buffers = [name for name, _ in module.named_buffers() if "running" in name]
        assert sorted(n for n, r in roles.items() if r == "running statistic") == sorted(buffers)


def test_element_wise_tensors_are_weights_only_beside_what_weights_compute():
    """An input normalization before any weight and ``1 - p`` are constants; a layer scale, a bias of one
    element after a MatMul and a decomposed LayerNorm's shift are weights; a single-element sign is not."""
    f32 = np.float32
    initializers = [
        ("mean", np.full(4, 0.5, f32)),  # x - mean, before any weight: a constant
        ("std", np.full(4, 2.0, f32)),  # (x - mean) / std: a constant
        ("w", np.ones((4, 1), f32)),
        ("b", np.zeros(1, f32)),  # a single output's bias: a weight
        ("gamma", np.ones(1, f32)),  # a single element multiplying: a constant (a sign, a temperature)
        ("layer_scale", np.ones((1, 1), f32) * 0.1),  # one element too: a constant by that rule
        ("unity", np.ones(1, f32)),  # 1 - p: the minuend is a constant
        ("shift", np.zeros(2, f32)),  # added to what weights computed: a weight
    ]
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], ["scaled"]),
        helper.make_node("MatMul", ["scaled", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["logit"]),
        helper.make_node("Mul", ["logit", "gamma"], ["signed"]),
        helper.make_node("Mul", ["signed", "layer_scale"], ["p"]),
        helper.make_node("Sub", ["unity", "p"], ["q"]),
        helper.make_node("Concat", ["p", "q"], ["pq"], axis=1),
        helper.make_node("Add", ["pq", "shift"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, ["n", 4])}, nodes, {"y": (FLOAT, ["n", 2])}, initializers)
    assert trainable_parameters(model) == ["w", "b", "shift"]


def test_a_weight_offset_or_scaled_by_a_constant_is_read_where_the_result_is():
    """Gemma's RMSNorm multiplies by ``1 + w``: as torch's dynamo exporter writes it (``Add(w, Constant)``) and
    as TorchScript does (``Add(Cast(w), initializer)``), ``w`` is a weight; a constant scaled by a constant and
    read as a fill value stays a constant."""
    f32 = np.float32
    initializers = [
        ("embed", np.eye(4, dtype=f32)),  # what the norms scale is computed from weights, as in the model
        ("dynamo.weight", np.zeros(4, f32)),
        ("torchscript.weight", np.zeros(4, f32)),
        ("one", np.ones((), f32)),
        ("fill", np.full(4, -1.0, f32)),
    ]
    nodes = [
        helper.make_node("Constant", [], ["unit"], value=helper.make_tensor("unit", FLOAT, [], [1.0])),
        helper.make_node("MatMul", ["x", "embed"], ["xe"]),
        helper.make_node("Add", ["dynamo.weight", "unit"], ["scale0"]),
        helper.make_node("Mul", ["xe", "scale0"], ["h0"]),
        helper.make_node("Cast", ["torchscript.weight"], ["cast"], to=FLOAT),
        helper.make_node("Add", ["one", "cast"], ["scale1"]),
        helper.make_node("Mul", ["h0", "scale1"], ["h1"]),
        helper.make_node("Mul", ["fill", "unit"], ["filled"]),
        helper.make_node("Greater", ["h1", "x"], ["mask"]),
        helper.make_node("Where", ["mask", "h1", "filled"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, ["n", 4])}, nodes, {"y": (FLOAT, ["n", 4])}, initializers)
    roles = initializer_roles(model)
    assert roles["dynamo.weight"] == roles["torchscript.weight"] == "weight"
    assert roles["fill"] == roles["one"] == "constant"


def test_a_view_of_an_initializer_is_a_weight_only_where_it_meets_what_weights_compute():
    """A class token expanded and concatenated with patch embeddings, a relative-position table dropped out,
    sliced and unsqueezed into a projection: weights. Rotary frequencies unsqueezed into a product with the
    positions (computed from the input's shape, not from weights' values): a constant."""
    f32 = np.float32
    rng = np.random.default_rng(0)
    initializers = [
        ("patch.weight", rng.normal(size=(4, 4)).astype(f32)),
        ("cls_token", np.zeros((1, 1, 4), f32)),
        ("rel.weight", rng.normal(size=(8, 4)).astype(f32)),
        ("proj.weight", rng.normal(size=(4, 4)).astype(f32)),
        ("inv_freq", np.ones(4, f32)),
        ("expand_shape", np.array([2, 1, 4], np.int64)),
        ("starts", np.array([0], np.int64)),
        ("ends", np.array([3], np.int64)),
        ("axis0", np.array([0], np.int64)),
        ("axes01", np.array([0, 1], np.int64)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "patch.weight"], ["patches"]),  # [2, 3, 4]
        helper.make_node("Expand", ["cls_token", "expand_shape"], ["cls"]),
        helper.make_node("Concat", ["cls", "patches"], ["tokens"], axis=1),  # [2, 4, 4]
        helper.make_node("Dropout", ["rel.weight"], ["rel_dropped"]),
        helper.make_node("Slice", ["rel_dropped", "starts", "ends"], ["rel_rows"]),  # [3, 4]
        helper.make_node("Unsqueeze", ["rel_rows", "axis0"], ["rel_batched"]),
        helper.make_node("MatMul", ["rel_batched", "proj.weight"], ["rel_keys"]),  # [1, 3, 4]
        helper.make_node("Shape", ["patches"], ["shape"]),
        helper.make_node("Gather", ["shape", "axis0"], ["length"]),
        helper.make_node("Cast", ["length"], ["length_f"], to=FLOAT),
        helper.make_node("Unsqueeze", ["length_f", "axis0"], ["positions"]),  # [1, 1]
        helper.make_node("Unsqueeze", ["inv_freq", "axes01"], ["freq"]),  # [1, 1, 4]
        helper.make_node("MatMul", ["positions", "freq"], ["angles"]),
        helper.make_node("Cos", ["angles"], ["cos"]),
        helper.make_node("Mul", ["tokens", "cos"], ["rotated"]),
        helper.make_node("ReduceSum", ["rel_keys"], ["rel_sum"], keepdims=0),
        helper.make_node("Add", ["rotated", "rel_sum"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, [2, 3, 4])}, nodes, {"y": (FLOAT, [2, 4, 4])}, initializers, opset=18)
    assert trainable_parameters(model) == ["patch.weight", "cls_token", "rel.weight", "proj.weight"]


def _from_fx(node: onnx.NodeProto, fx: str, target: str, arguments: str) -> onnx.NodeProto:
    """``node`` with the FX node torch's dynamo exporter writes on it: ``%fx = target(arguments)``."""
    from onnxtrain.graph.torch_metadata import FX_NODE_KEY

    node.metadata_props.add(
        key=FX_NODE_KEY,
        value=f"%{fx} : [num_users=1] = call_function[target=torch.ops.aten.{target}](args = ({arguments}), "
        "kwargs = {})",
    )
    return node


def _signed(model: onnx.ModelProto, *entries: str) -> onnx.ModelProto:
    """``model`` with the exported program's signature of ``entries`` (``p_w: PARAMETER target='w'``), then
    the user input ``x``."""
    from onnxtrain.graph.torch_metadata import SIGNATURE_KEY

    model.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join(["# inputs", *entries, "x: USER_INPUT"]))
    return model


def test_the_signature_of_torchs_dynamo_export_says_which_are_parameters():
    """A buffer added to the logits as a bias is (BART's ``final_logits_bias``) is a constant and a rank-0
    parameter scaling them (CLIP's temperature) a weight where the exported program's signature says so; an
    initializer the signature does not name (one the exporter's optimizer made) keeps the rules."""
    f32 = np.float32
    initializers = [
        ("head.weight", np.ones((4, 3), f32)),
        ("val_3", np.ones((3, 3), f32)),
        ("final_logits_bias", np.zeros((1, 3), f32)),
        ("logit_scale", np.array(2.0, f32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "head.weight"], ["h"]),
        helper.make_node("MatMul", ["h", "val_3"], ["logits"]),
        helper.make_node("Add", ["logits", "final_logits_bias"], ["biased"]),
        helper.make_node("Mul", ["biased", "logit_scale"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, ["n", 4])}, nodes, {"y": (FLOAT, ["n", 3])}, initializers)
    assert trainable_parameters(model) == ["head.weight", "val_3", "final_logits_bias"]  # the rules alone
    _signed(
        model,
        "p_head_weight: PARAMETER target='head.weight'",
        "p_logit_scale: PARAMETER target='logit_scale'",
        "b_final_logits_bias: BUFFER target='final_logits_bias' persistent=True",
    )
    assert trainable_parameters(model) == ["head.weight", "val_3", "logit_scale"]


def test_a_buffer_the_dynamo_exporters_optimizer_folded_is_a_constant_where_a_folded_weight_stays_a_weight():
    """GPT-J's rotary table, a buffer, is indexed by position with ``GatherND`` (an embedding's slot) after the
    exporter's optimizer folded it into ``val_125``: the FX node its reader came from read the buffer and no
    parameter, so it is a constant; ``val_135``, a weight's transpose folded, is read where torch read the
    parameter, and stays a weight."""
    f32 = np.float32
    initializers = [
        ("proj.weight", np.ones((4, 4), f32)),
        ("val_135", np.ones((4, 3), f32)),
        ("val_125", np.ones((64, 4), f32)),
    ]
    gather = helper.make_node("GatherND", ["val_125", "positions"], ["sincos"])
    head = helper.make_node("MatMul", ["h", "val_135"], ["scores"])
    nodes = [
        helper.make_node("MatMul", ["x", "proj.weight"], ["p"]),
        _from_fx(gather, "index_4", "index.Tensor", "%b_rotary_emb_embed_positions, [%unsqueeze]"),
        helper.make_node("Add", ["p", "sincos"], ["h"]),
        _from_fx(head, "linear_1", "linear.default", "%add, %p_head_weight"),
    ]
    model = make_model(
        {"x": (FLOAT, ["n", 4]), "positions": (INT64, ["n", 1])}, nodes, {"scores": (FLOAT, ["n", 3])}, initializers
    )
    assert trainable_parameters(model) == ["proj.weight", "val_135", "val_125"]  # no signature: the rules, a table
    _signed(
        model,
        "p_proj_weight: PARAMETER target='proj.weight'",
        "p_head_weight: PARAMETER target='head.weight'",
        "b_rotary_emb_embed_positions: BUFFER target='rotary_emb.embed_positions' persistent=False",
    )
    assert trainable_parameters(model) == ["proj.weight", "val_135"]
    assert initializer_roles(model)["val_125"] == "constant"


def _rotary_at_a_fixed_length(unread_parameter: bool) -> onnx.ModelProto:
    """A dynamo export's shape where the sequence length was fixed: the rotary table folded into
    ``unsqueeze_14`` is read by a ``Mul`` whose FX node read ``%unsqueeze_14`` (folded too), beside what a
    weight computes; ``val_27`` is ``q.weight`` transposed (its FX node read ``%p_q_weight``). With
    ``unread_parameter``, a parameter ``w`` no node reads: folded somewhere, maybe into ``unsqueeze_14``."""
    f32 = np.float32
    initializers = [
        ("k.weight", np.ones((4, 4), f32)),
        ("val_27", np.ones((4, 4), f32)),
        ("unsqueeze_14", np.ones((1, 4), f32)),
    ]
    nodes = [
        _from_fx(helper.make_node("MatMul", ["x", "k.weight"], ["k"]), "matmul", "matmul.default", "%x, %p_k_weight"),
        _from_fx(helper.make_node("MatMul", ["x", "val_27"], ["q"]), "linear", "linear.default", "%x, %p_q_weight"),
        _from_fx(
            helper.make_node("Mul", ["q", "unsqueeze_14"], ["rotated"]), "mul_3", "mul.Tensor", "%linear, %unsqueeze_14"
        ),
        helper.make_node("Add", ["rotated", "k"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, ["n", 4])}, nodes, {"y": (FLOAT, ["n", 4])}, initializers)
    entries = [
        "p_q_weight: PARAMETER target='q.weight'",
        "p_k_weight: PARAMETER target='k.weight'",
        "b_inv_freq: BUFFER target='rotary.inv_freq' persistent=False",
    ]
    return _signed(model, *entries, *(["p_w: PARAMETER target='w'"] if unread_parameter else []))


def test_a_rotary_table_folded_at_a_fixed_length_is_a_constant_when_every_parameter_is_found():
    """Every parameter of the signature is read under its name or found folded where torch read it (``q.weight``
    as ``val_27``): ``unsqueeze_14``, which the rules alone make a weight (a scale beside what weights compute),
    is a buffer's value. A parameter no node reads may have been folded into it: then the rules decide."""
    assert trainable_parameters(_rotary_at_a_fixed_length(unread_parameter=False)) == ["k.weight", "val_27"]
    assert trainable_parameters(_rotary_at_a_fixed_length(unread_parameter=True)) == [
        "k.weight", "val_27", "unsqueeze_14"
    ]  # fmt: skip


def test_weights_cut_and_joined_or_viewed_beside_the_inputs_are_weights():
    """LSTM's export reorders a weight's gates by slicing and concatenating it, and PReLU's slope and
    MultiheadAttention's packed projection meet the float input itself in their slots: weights. A constant
    concatenated with the input is not a view of a weight, and frequencies multiplied with positions cast from
    an integer input stay constants."""
    f32 = np.float32
    rng = np.random.default_rng(0)
    initializers = [
        ("gates", rng.normal(size=(8, 4)).astype(f32)),  # cut in two and joined in the other order
        ("slope", np.full(4, 0.25, f32)),
        ("packed", rng.normal(size=(8, 4)).astype(f32)),  # two projections in one tensor
        ("features", np.ones((1, 1), f32)),  # a constant column beside the input
        ("head", rng.normal(size=(5, 4)).astype(f32)),
        ("inv_freq", np.ones(4, f32)),
        ("zero", np.array([0], np.int64)),
        ("four", np.array([4], np.int64)),
        ("eight", np.array([8], np.int64)),
        ("axis1", np.array([1], np.int64)),
    ]
    nodes = [
        helper.make_node("Slice", ["gates", "zero", "four"], ["first"]),
        helper.make_node("Slice", ["gates", "four", "eight"], ["second"]),
        helper.make_node("Concat", ["second", "first"], ["reordered"], axis=0),
        helper.make_node("Transpose", ["reordered"], ["reordered_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "reordered_t"], ["h8"]),  # [n, 8]
        helper.make_node("Slice", ["h8", "zero", "four", "axis1"], ["h"]),  # [n, 4]
        helper.make_node("Unsqueeze", ["slope", "zero"], ["slope_row"]),
        helper.make_node("PRelu", ["x", "slope_row"], ["activated"]),
        helper.make_node("Slice", ["packed", "zero", "four"], ["query"]),
        helper.make_node("Transpose", ["query"], ["query_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["activated", "query_t"], ["q"]),
        helper.make_node("Concat", ["x", "features"], ["widened"], axis=1),  # [n, 5]
        helper.make_node("MatMul", ["widened", "head"], ["w"]),
        helper.make_node("Cast", ["ids"], ["positions"], to=FLOAT),  # [n, 1]
        helper.make_node("Unsqueeze", ["inv_freq", "zero"], ["freq"]),
        helper.make_node("MatMul", ["positions", "freq"], ["angles"]),
        helper.make_node("Sum", ["h", "q", "w", "angles"], ["y"]),
    ]
    inputs = {"x": (FLOAT, [1, 4]), "ids": (INT64, [1, 1])}
    model = make_model(inputs, nodes, {"y": (FLOAT, [1, 4])}, initializers, opset=18)
    assert trainable_parameters(model) == ["gates", "slope", "packed", "head"]


def test_a_viewed_tensor_beside_a_product_or_a_normalization_is_its_bias_or_affine():
    """A packed bias sliced and added to a product, GroupNorm's weight and bias unsqueezed after an
    ``InstanceNormalization`` by constant ones, and a learned positional table sliced and added to embeddings:
    weights. A table of sines and cosines sliced and added to embeddings, a rotary table sliced and
    multiplying a projection, and a shift unsqueezed after a normalization that has its own scale: constants."""
    f32 = np.float32
    rng = np.random.default_rng(0)
    initializers = [
        ("proj", rng.normal(size=(4, 4)).astype(f32)),
        ("packed_bias", np.zeros(8, f32)),
        ("table", rng.normal(size=(10, 4)).astype(f32)),
        ("pe", sinusoids(16, 4)),  # a buffer of sines and cosines
        ("learned", rng.normal(size=(16, 4)).astype(f32)),  # a learned table
        ("cos_cached", rng.normal(size=(16, 4)).astype(f32)),
        ("group.weight", np.ones(4, f32)),
        ("group.bias", np.zeros(4, f32)),
        ("ln.weight", np.ones(4, f32)),
        ("shift", np.zeros(4, f32)),
        ("zero", np.array([0], np.int64)),
        ("one", np.array([1], np.int64)),
        ("two", np.array([2], np.int64)),
        ("four", np.array([4], np.int64)),
        ("minus1", np.array([-1], np.int64)),
        ("grouped", np.array([2, 2, -1], np.int64)),
        ("back", np.array([2, 4, 1], np.int64)),
    ]
    ones = helper.make_tensor("ones", FLOAT, [2], [1.0, 1.0])
    zeros = helper.make_tensor("zeros", FLOAT, [2], [0.0, 0.0])
    nodes = [
        helper.make_node("MatMul", ["x", "proj"], ["xp"]),  # [2, 4]
        helper.make_node("Slice", ["packed_bias", "zero", "four"], ["bias"]),
        helper.make_node("Add", ["xp", "bias"], ["biased"]),
        helper.make_node("Gather", ["table", "ids"], ["embedded"]),  # [2, 4]
        helper.make_node("Slice", ["pe", "zero", "two"], ["pe_rows"]),
        helper.make_node("Add", ["embedded", "pe_rows"], ["fixed"]),
        helper.make_node("Slice", ["learned", "zero", "two"], ["learned_rows"]),
        helper.make_node("Add", ["fixed", "learned_rows"], ["positioned"]),
        helper.make_node("Slice", ["cos_cached", "zero", "two"], ["cos"]),
        helper.make_node("Mul", ["biased", "cos"], ["rotated"]),
        # GroupNorm of 2 groups over 4 channels, as torch's TorchScript exporter writes it
        helper.make_node("Constant", [], ["scale_ones"], value=ones),
        helper.make_node("Constant", [], ["bias_zeros"], value=zeros),
        helper.make_node("Reshape", ["positioned", "grouped"], ["groups"]),  # [2, 2, 2]
        helper.make_node("InstanceNormalization", ["groups", "scale_ones", "bias_zeros"], ["normed"]),
        helper.make_node("Reshape", ["normed", "back"], ["normed_back"]),  # [2, 4, 1]
        helper.make_node("Unsqueeze", ["group.weight", "one"], ["gw"]),  # [4, 1]
        helper.make_node("Mul", ["normed_back", "gw"], ["scaled"]),
        helper.make_node("Unsqueeze", ["group.bias", "one"], ["gb"]),
        helper.make_node("Add", ["scaled", "gb"], ["grouped_out"]),
        helper.make_node("Squeeze", ["grouped_out", "minus1"], ["g"]),  # [2, 4]
        helper.make_node("LayerNormalization", ["rotated", "ln.weight"], ["ln"], axis=-1),
        helper.make_node("Unsqueeze", ["shift", "zero"], ["shift_row"]),
        helper.make_node("Add", ["ln", "shift_row"], ["shifted"]),
        helper.make_node("Add", ["g", "shifted"], ["y"]),
    ]
    inputs = {"x": (FLOAT, [2, 4]), "ids": (INT64, [2])}
    model = make_model(inputs, nodes, {"y": (FLOAT, [2, 4])}, initializers, opset=18)
    roles = initializer_roles(model)
    assert [name for name, role in roles.items() if role == "weight"] == [
        "proj", "packed_bias", "table", "learned", "group.weight", "group.bias", "ln.weight",
    ]  # fmt: skip


def test_a_bias_added_to_a_product_scaled_per_channel_is_a_weight():
    """torch.ao's fused convolution and BatchNorm for quantization-aware training: the convolution, divided by
    the normalization's per-channel factor (computed from weights), then its bias reshaped and added. A product
    scaled by what the inputs compute (an attention's probabilities times values, say) keeps its addend a
    constant."""
    f32 = np.float32
    initializers = [
        ("conv.weight", np.ones((2, 1, 3, 3), f32)),
        ("conv.bias", np.zeros(2, f32)),
        ("bn.weight", np.ones(2, f32)),
        ("channels", np.array([1, 2, 1, 1], np.int64)),
        ("offset", np.full(2, 0.5, f32)),
    ]
    nodes = [
        helper.make_node("Reshape", ["bn.weight", "channels"], ["factor"]),
        helper.make_node("Mul", ["conv.weight", "factor_w"], ["scaled_weight"]),
        helper.make_node("Reshape", ["bn.weight", "weight_shape"], ["factor_w"]),
        helper.make_node("Conv", ["x", "scaled_weight"], ["y"]),
        helper.make_node("Div", ["y", "factor"], ["unscaled"]),
        helper.make_node("Reshape", ["conv.bias", "channels"], ["bias"]),
        helper.make_node("Add", ["unscaled", "bias"], ["out"]),
        helper.make_node("Div", ["y", "x_scale"], ["by_data"]),  # scaled by what the inputs compute
        helper.make_node("Reshape", ["offset", "channels"], ["offset_view"]),
        helper.make_node("Add", ["by_data", "offset_view"], ["out2"]),
        helper.make_node("Add", ["out", "out2"], ["z"]),
    ]
    initializers.append(("weight_shape", np.array([2, 1, 1, 1], np.int64)))
    inputs = {"x": (FLOAT, [1, 1, 5, 5]), "x_scale": (FLOAT, [1, 2, 1, 1])}
    ordered = [nodes[2], *nodes[:2], *nodes[3:]]
    model = make_model(inputs, ordered, {"z": (FLOAT, [1, 2, 3, 3])}, initializers, opset=18)
    roles = initializer_roles(model)
    assert roles["conv.bias"] == "weight" and roles["bn.weight"] == "weight"
    assert roles["offset"] == "constant"


def test_a_weight_computed_from_initializers_alone_is_re_parametrised_by_them():
    """Weight normalization writes a convolution's weight ``g * v / ||v||``: ``g`` and ``v`` are weights. An
    integer weight dequantized by its scale keeps the scale a constant (not arithmetic on floats alone)."""
    f32 = np.float32
    rng = np.random.default_rng(0)
    initializers = [
        ("v", rng.normal(size=(3, 2, 2)).astype(f32)),
        ("g", np.ones((1, 1, 2), f32)),
        ("quantized", rng.integers(-8, 8, size=(3, 3)).astype(np.int8)),
        ("scale", np.array(0.1, f32)),
        ("axes", np.array([0, 1], np.int64)),
    ]
    nodes = [
        helper.make_node("ReduceL2", ["v", "axes"], ["norm"], keepdims=1),
        helper.make_node("Div", ["v", "norm"], ["direction"]),
        helper.make_node("Mul", ["direction", "g"], ["kernel"]),
        helper.make_node("Conv", ["x", "kernel"], ["conv"]),  # [1, 3, 3]
        helper.make_node("DequantizeLinear", ["quantized", "scale"], ["dequantized"]),
        helper.make_node("MatMul", ["conv", "dequantized"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, [1, 2, 4])}, nodes, {"y": (FLOAT, [1, 3, 3])}, initializers, opset=18)
    assert trainable_parameters(model) == ["v", "g"]


def _torch_layers():
    """torch layers whose parameters the export cuts, joins, views, resizes or re-parametrises; and models whose
    float buffers (a positional table, a rotary cache) are sliced into what weights compute."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Rotary(nn.Module):
        """A projection rotated by cached cos and sin tables, sliced to the sequence (older GPT-NeoX)."""

        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(4, 4)
            self.register_buffer("cos_cached", torch.randn(16, 4))
            self.register_buffer("sin_cached", torch.randn(16, 4))

        def forward(self, x):
            q = self.q(x)
            length = x.shape[1]
            return q * self.cos_cached[:length] + torch.flip(q, (-1,)) * self.sin_cached[:length]

    class Positional(nn.Module):
        """PyTorch's tutorial: embeddings scaled by sqrt(d), plus a sliced buffer of sines and cosines; and a
        learned table sliced alike (GPT-style models written by hand), which torch trains."""

        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(10, 4)
            self.register_buffer("pe", torch.from_numpy(sinusoids(16, 4)).reshape(16, 1, 4))
            self.learned = nn.Parameter(torch.randn(16, 1, 4) * 0.02)
            self.out = nn.Linear(4, 2)

        def forward(self, ids):
            x = self.embedding(ids) * 2.0 + self.pe[: ids.size(0)] + self.learned[: ids.size(0)]
            return self.out(x)

    class Interpolated(nn.Module):
        """DINOv2's and BEiT's tables: position embeddings and a relative-position bias table, each resized
        (bicubic) to the input before use; the bias gathered by a buffer of indices into the attention
        scores. A sinusoidal buffer sliced and added stays a buffer."""

        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 4, 2, stride=2)
            self.cls_token = nn.Parameter(torch.randn(1, 1, 4))
            self.position_embeddings = nn.Parameter(torch.randn(1, 5, 4))
            self.table = nn.Parameter(torch.randn(9, 1))
            self.register_buffer("index", torch.randint(0, 9, (5, 5)))
            self.register_buffer("pe", torch.from_numpy(sinusoids(8, 4, halves=True)))
            self.qk = nn.Linear(4, 8)

        def forward(self, pixels):
            patches = self.patch(pixels).flatten(2).transpose(1, 2)  # [N, 4, 4]
            grid = self.position_embeddings[:, 1:].reshape(1, 2, 2, 4).permute(0, 3, 1, 2)
            grid = nn.functional.interpolate(grid, size=(pixels.shape[-2] // 2, pixels.shape[-1] // 2), mode="bicubic")
            positions = torch.cat([self.position_embeddings[:, :1], grid.flatten(2).transpose(1, 2)], dim=1)
            tokens = torch.cat([self.cls_token.expand(pixels.shape[0], -1, -1), patches], dim=1) + positions
            tokens = tokens + self.pe[: tokens.shape[1]]
            q, k = self.qk(tokens).chunk(2, dim=-1)
            table = nn.functional.interpolate(self.table.T.reshape(1, 1, 3, 3), size=(3, 3), mode="bilinear")
            bias = table.reshape(9)[self.index]
            return (q @ k.transpose(1, 2) * 0.5 + bias).softmax(-1) @ tokens

    class PoolFormerBlock(nn.Module):
        """PoolFormer's block: the pooling minus its input after a GroupNorm, and a 1x1 MLP, each scaled by a
        per-channel layer scale unsqueezed to the channels."""

        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.GroupNorm(1, 4), nn.GroupNorm(1, 4)
            self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
            self.fc1, self.fc2 = nn.Conv2d(4, 8, 1), nn.Conv2d(8, 4, 1)
            self.layer_scale_1 = nn.Parameter(torch.full((4,), 0.1))
            self.layer_scale_2 = nn.Parameter(torch.full((4,), 0.1))

        def forward(self, x):
            n = self.norm1(x)
            x = x + self.layer_scale_1.unsqueeze(-1).unsqueeze(-1) * (self.pool(n) - n)
            mlp = self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))
            return x + self.layer_scale_2.unsqueeze(-1).unsqueeze(-1) * mlp

    class Selective(nn.Module):
        """Mamba's and Funnel's parameters: a decay stored as its logarithm (``A = -exp(A_log)``) scaling what
        a projection computes, a skip weight ``D`` unsqueezed onto the channels, and a kernel read by an
        ``Einsum``. Image statistics unsqueezed onto the input stay buffers."""

        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.A_log = nn.Parameter(torch.randn(4))
            self.D = nn.Parameter(torch.ones(4))
            self.kernel = nn.Parameter(torch.randn(4, 2, 3))
            self.register_buffer("std", torch.rand(4) + 0.5)

        def forward(self, x):
            x = x / self.std[None, None, :]
            h = nn.functional.silu(self.proj(x))
            decayed = torch.exp(h * -torch.exp(self.A_log.float())) + h * self.D[None, None, :]
            return torch.einsum("bti,ijk->btjk", decayed, self.kernel)

    class Standardized(nn.Module):
        """BiT's weight-standardized convolution (its kernel normalized by a ``BatchNormalization`` of the
        reshaped weight) and Swin v2's attention temperature ``exp(clamp(logit_scale, max=log 100))``."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(4, 1, 1)))

        def forward(self, x):
            flat = self.conv.weight.reshape(1, 4, -1)
            kernel = nn.functional.batch_norm(flat, None, None, training=True, momentum=0.0, eps=1e-6)
            y = nn.functional.conv2d(x, kernel.reshape_as(self.conv.weight), self.conv.bias, padding=1)
            return y * torch.clamp(self.logit_scale, max=4.6052).exp()

    sequence = torch.randn(2, 3, 4)
    return {
        "GroupNorm": (nn.GroupNorm(2, 4), (torch.randn(2, 4, 3),)),
        "PReLU": (nn.PReLU(4), (torch.randn(2, 4, 3),)),
        "MultiheadAttention": (nn.MultiheadAttention(4, 2, batch_first=True), (sequence, sequence, sequence)),
        "LSTM": (nn.LSTM(4, 3, num_layers=2, bidirectional=True), (sequence,)),
        "GRU": (nn.GRU(4, 3), (sequence,)),
        "TransformerDecoderLayer": (
            nn.TransformerDecoderLayer(4, 2, dim_feedforward=8, dropout=0.0),
            (sequence, sequence),
        ),
        "weight_norm": (nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 3, 2), dim=2), (torch.randn(2, 4, 5),)),
        "rotary cache": (Rotary(), (sequence,)),
        "positional table": (Positional(), (torch.randint(0, 10, (3, 2)),)),
        "interpolated tables": (Interpolated(), (torch.randn(2, 3, 4, 4),)),
        "PoolFormer block": (PoolFormerBlock(), (torch.randn(2, 4, 5, 5),)),
        "decays and einsum kernels": (Selective(), (sequence,)),
        "standardized kernel and temperature": (Standardized(), (torch.randn(2, 3, 5, 5),)),
    }


@pytest.mark.parametrize(
    "name",
    [
        "GroupNorm",
        "PReLU",
        "MultiheadAttention",
        "LSTM",
        "GRU",
        "TransformerDecoderLayer",
        "weight_norm",
        "rotary cache",
        "positional table",
        "interpolated tables",
        "PoolFormer block",
        "decays and einsum kernels",
        "standardized kernel and temperature",
    ],
)
def test_torch_layers_cut_joined_or_re_parametrised_train_their_parameters_and_not_their_buffers(name):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer, inputs = _torch_layers()[name]

    class Call(torch.nn.Module):  # the inputs alone: the exporter would make inputs of the other arguments
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, *args):
            out = self.layer(*args)
            return out[0] if isinstance(out, tuple) else out

    module = Call().train()
    names = [f"x{k}" for k in range(len(inputs))]
    model = export_for_training(module, inputs, names, ["y"], opset=17)
    stored = {t.name for t in model.graph.initializer}
    parameters = sorted(n for n, _ in module.named_parameters() if n in stored)
    assert len(parameters) == len(list(module.parameters())), "the export stores every parameter"
    assert sorted(trainable_parameters(model)) == parameters


def _loop(body_nodes, body_inputs, body_outputs, carried, name="loop"):
    """A ``Loop`` of ``trip`` iterations over ``body``; ``carried`` are its ``v_initial`` inputs."""
    value = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Identity", [f"{name}_cond_in"], [f"{name}_cond_out"]), *body_nodes],
        f"{name}_body",
        [value(f"{name}_i", INT64, []), value(f"{name}_cond_in", BOOL, []), *body_inputs],
        [value(f"{name}_cond_out", BOOL, []), *body_outputs],
    )
    outputs = [f"{name}_{v.name}_final" for v in body_outputs]
    return helper.make_node("Loop", ["trip", "", *carried], outputs, body=body)


def _rnn_loop_model(*, carried: bool) -> onnx.ModelProto:
    """A recurrent cell as tf2onnx writes a ``tf.while_loop``: ``h = tanh(h @ R + b)`` three times, its
    recurrent kernel ``R`` and bias ``b`` passed into the loop as carried values (``carried``) and passed
    through unchanged, or read by the body from the outer scope; ``h0`` an initial state the body updates."""
    value = helper.make_tensor_value_info
    r_in, b_in = ("r_in", "b_in") if carried else ("R", "b")
    nodes = [
        helper.make_node("MatMul", ["h_in", r_in], ["hr"]),
        helper.make_node("Add", ["hr", b_in], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
    ]
    inputs = [value("h_in", FLOAT, [1, 4])]
    outputs = [value("h_out", FLOAT, [1, 4])]
    if carried:
        nodes.append(helper.make_node("Identity", ["r_in"], ["r_out"]))  # through Identity, or as it is
        inputs += [value("r_in", FLOAT, [4, 4]), value("b_in", FLOAT, [4])]
        outputs += [value("r_out", FLOAT, [4, 4]), value("b_in", FLOAT, [4])]
    loop = _loop(nodes, inputs, outputs, ["h0", *(["R", "b"] if carried else [])])
    head = helper.make_node("MatMul", [loop.output[0], "x"], ["y"])
    initializers = [
        ("R", np.eye(4, dtype=np.float32) * 0.5),
        ("b", np.full(4, 0.1, np.float32)),
        ("h0", np.ones((1, 4), np.float32)),
        ("trip", np.array(3, np.int64)),
    ]
    model = make_model({"x": (FLOAT, [4, 2])}, [loop, head], {"y": (FLOAT, [1, 2])}, initializers)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("carried", [True, False], ids=["carried", "outer scope"])
def test_weights_a_loop_passes_to_its_body_are_weights(carried):
    """tf2onnx exports a Keras GRU, SimpleRNN and any ``tf.while_loop`` with the kernels and bias passed into the
    ``Loop`` as carried values the body passes through unchanged. Read by the ``Loop`` node in no weight slot,
    they were constants and ``requires_grad="weights"`` trained the head alone. The state's initial value the
    body updates stays a constant (tf2onnx's zeros)."""
    roles = initializer_roles(_rnn_loop_model(carried=carried))
    assert roles == {"R": "weight", "b": "weight", "h0": "constant", "trip": "constant"}


def test_weights_carried_through_nested_loops_and_split_in_the_body_are_weights():
    """A weight carried through two loops, one inside the other, is read where the inner body reads it; a Keras
    GRU's bias (two rows) is split in the body, each row added to a product."""
    value = helper.make_tensor_value_info
    inner = _loop(
        [
            helper.make_node("MatMul", ["h_in", "w_inner"], ["hw"]),
            helper.make_node("Split", ["bias_inner"], ["b0", "b1"], axis=0),
            helper.make_node("Squeeze", ["b0", "zero"], ["b0_row"]),
            helper.make_node("Add", ["hw", "b0_row"], ["h_out"]),
        ],
        [value("h_in", FLOAT, [1, 4]), value("w_inner", FLOAT, [4, 4]), value("bias_inner", FLOAT, [2, 4])],
        [value("h_out", FLOAT, [1, 4]), value("w_inner", FLOAT, [4, 4]), value("bias_inner", FLOAT, [2, 4])],
        ["g_in", "w_outer", "bias_outer"],
        name="inner",
    )
    outer = _loop(
        [inner, helper.make_node("Identity", ["w_outer"], ["w_back"])],
        [value("g_in", FLOAT, [1, 4]), value("w_outer", FLOAT, [4, 4]), value("bias_outer", FLOAT, [2, 4])],
        [value(inner.output[0], FLOAT, [1, 4]), value("w_back", FLOAT, [4, 4]), value("bias_outer", FLOAT, [2, 4])],
        ["x", "W", "B"],
        name="outer",
    )
    initializers = [
        ("W", np.eye(4, dtype=np.float32)),
        ("B", np.zeros((2, 4), np.float32)),
        ("trip", np.array(2, np.int64)),
        ("zero", np.array([0], np.int64)),
    ]
    model = make_model({"x": (FLOAT, [1, 4])}, [outer], {outer.output[0]: (FLOAT, [1, 4])}, initializers)
    onnx.checker.check_model(model, full_check=True)
    assert initializer_roles(model) == {"W": "weight", "B": "weight", "trip": "constant", "zero": "constant"}


def test_weights_a_scan_passes_as_states_are_weights_and_a_branch_reads_from_the_outer_scope():
    """A ``Scan``'s state passed through unchanged is read where its body reads it; an ``If`` branch reading a
    tensor of the outer scope reads it as the graph does. The initial value of a state the body updates and
    a tensor scanned by a constant stay constants."""
    value = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x_t", "w_state"], ["xw"]),
            helper.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
            helper.make_node("Mul", ["xw", "k_t"], ["y_t"]),
        ],
        "scan_body",
        [
            value("acc_in", FLOAT, [1, 3]),
            value("w_state", FLOAT, [2, 3]),
            value("x_t", FLOAT, [1, 2]),
            value("k_t", FLOAT, [1, 1]),
        ],
        [value("acc_out", FLOAT, [1, 3]), value("w_state", FLOAT, [2, 3]), value("y_t", FLOAT, [1, 3])],
    )
    scan = helper.make_node("Scan", ["acc0", "W", "x", "K"], ["acc", "w_final", "ys"], body=body, num_scan_inputs=2)
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["acc", "V"], ["then_y"])], "then", [], [value("then_y", FLOAT, [1, 2])]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["fallback"], ["else_y"])], "else", [], [value("else_y", FLOAT, [1, 2])]
    )
    branches = helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=other)
    initializers = [
        ("W", np.ones((2, 3), np.float32)),
        ("acc0", np.zeros((1, 3), np.float32)),
        ("K", np.ones((5, 1, 1), np.float32)),
        ("V", np.ones((3, 2), np.float32)),
        ("fallback", np.zeros((1, 2), np.float32)),
    ]
    model = make_model(
        {"x": (FLOAT, [5, 1, 2]), "flag": (BOOL, [])},
        [scan, branches],
        {"y": (FLOAT, [1, 2]), "ys": (FLOAT, [5, 1, 3])},
        initializers,
    )
    onnx.checker.check_model(model, full_check=True)
    roles = initializer_roles(model)
    assert roles == {"W": "weight", "acc0": "constant", "K": "constant", "V": "weight", "fallback": "constant"}
