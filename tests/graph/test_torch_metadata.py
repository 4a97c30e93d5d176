"""The parameters torch's dynamo exporter merged, dropped or folded, read from the metadata of its nodes.

The models are written by hand with the two ``metadata_props`` the exporter
writes (the module scopes and the FX node), so that the rules are checked
without torch; ``tests/transformers/test_dynamo_export.py`` checks them on
torch's own exports.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.artifacts import TorchExportWarning
from onnxtrain.artifacts.exported_parameters import explain_missing, warn_changed_parameters
from onnxtrain.graph.torch_metadata import (
    FX_NODE_KEY,
    NAME_SCOPES_KEY,
    SIGNATURE_KEY,
    parameter_changes,
    parameters_read,
    placeholder,
    signature_parameters,
)


def _node(op: str, inputs: list[str], output: str, module: str, fx: str, **attrs: object) -> onnx.NodeProto:
    """``op`` with the dynamo exporter's metadata: ``module``'s scopes and FX node ``fx`` (the nodes made from one
    FX node share it)."""
    node = helper.make_node(op, inputs, [output], name=f"node_{output}", **attrs)
    scopes = ["", *(".".join(module.split(".")[: i + 1]) for i in range(len(module.split(".")))), output]
    node.metadata_props.add(key=NAME_SCOPES_KEY, value=repr(scopes))
    node.metadata_props.add(key=FX_NODE_KEY, value=fx)
    return node


def _tensor(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value.astype(np.float32), name)


def exported_model(kept: bool) -> onnx.ModelProto:
    """Two LayerNorms and a linear head, as the exporter writes them with ``optimize=False`` (``kept``: each
    parameter read under its name) or ``optimize=True`` (the norms' equal weights merged, the head's zero bias
    dropped, its weight folded into its transpose ``val_7``)."""
    ones, zeros = np.ones(4), np.zeros(4)
    head = np.arange(12.0).reshape(3, 4)
    call = "%{} : [num_users=1] = call_function[target=torch.ops.aten.{}.default](args = ({}), kwargs = {{}})"
    ln1 = call.format("layer_norm", "layer_norm", "%x, [4], %p_net_ln1_weight, %p_net_ln1_bias, 1e-05")
    ln2 = call.format("layer_norm_1", "layer_norm", "%layer_norm, [4], %p_net_ln2_weight, %p_net_ln2_bias, 1e-05")
    linear = call.format("linear", "linear", "%layer_norm_1, %p_net_head_weight, %p_net_head_bias")
    if kept:
        initializers = [
            _tensor("net.ln1.weight", ones), _tensor("net.ln1.bias", zeros), _tensor("net.ln2.weight", ones),
            _tensor("net.ln2.bias", zeros), _tensor("net.head.weight", head), _tensor("net.head.bias", np.zeros(3)),
        ]  # fmt: skip
        nodes = [
            _node("LayerNormalization", ["x", "net.ln1.weight", "net.ln1.bias"], "h", "net.ln1", ln1),
            _node("LayerNormalization", ["h", "net.ln2.weight", "net.ln2.bias"], "h2", "net.ln2", ln2),
            _node("Transpose", ["net.head.weight"], "wt", "net.head", linear, perm=[1, 0]),
            _node("MatMul", ["h2", "wt"], "mm", "net.head", linear),
            _node("Add", ["mm", "net.head.bias"], "y", "net.head", linear),
        ]
    else:
        initializers = [_tensor("net.ln1.weight", ones), _tensor("net.ln1.bias", zeros), _tensor("val_7", head.T)]
        nodes = [
            _node("LayerNormalization", ["x", "net.ln1.weight", "net.ln1.bias"], "h", "net.ln1", ln1),
            _node("LayerNormalization", ["h", "net.ln1.weight", "net.ln1.bias"], "h2", "net.ln2", ln2),
            _node("MatMul", ["h2", "val_7"], "y", "net.head", linear),
        ]
    graph = helper.make_graph(
        nodes,
        "exported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def with_signature(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, given the exported program's signature that the exporter writes, naming each parameter."""
    parameters = (
        "net.ln1.weight",
        "net.ln1.bias",
        "net.ln2.weight",
        "net.ln2.bias",
        "net.head.weight",
        "net.head.bias",
    )
    lines = ["", "# inputs", *(f"{placeholder(name)}: PARAMETER target='{name}'" for name in parameters)]
    lines += ["x: USER_INPUT", "", "# outputs", "y: USER_OUTPUT"]
    model.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join(lines))
    return model


def test_placeholders_are_torchs_names_in_lower_case_with_underscores() -> None:
    assert placeholder("model.bert.embeddings.LayerNorm.weight") == "p_model_bert_embeddings_layernorm_weight"
    node = exported_model(kept=True).graph.node[0]
    assert parameters_read(node) == ("p_net_ln1_weight", "p_net_ln1_bias")
    assert parameters_read(helper.make_node("Relu", ["x"], ["y"])) == ()


def test_an_export_that_reads_each_parameter_under_its_name_has_no_change() -> None:
    assert parameter_changes(exported_model(kept=True)) == []


def test_merged_dropped_and_folded_parameters_are_found_under_torchs_names() -> None:
    changes = {change.module: change for change in parameter_changes(exported_model(kept=False))}
    assert set(changes) == {"net.ln2", "net.head"}
    merged, head = changes["net.ln2"], changes["net.head"]
    assert (merged.change, merged.parameters) == ("merged", ("net.ln2.weight", "net.ln2.bias"))
    assert merged.read_as == ("net.ln1.weight", "net.ln1.bias")
    # the head's weight folded into val_7 and its bias dropped: one FX node, both parameters, a computed constant
    assert (head.change, head.parameters, head.read_as) == ("folded", ("net.head.weight", "net.head.bias"), ("val_7",))


def test_the_signature_names_the_parameters_where_the_module_scopes_do_not() -> None:
    model = exported_model(kept=False)
    for node in model.graph.node:  # every node in the scope of the parent module "net"
        for prop in node.metadata_props:
            if prop.key == NAME_SCOPES_KEY:
                prop.value = repr(["", "net", node.output[0]])
    guessed = {change.parameters for change in parameter_changes(model)}
    assert ("net.ln2_weight", "net.ln2_bias") in guessed  # the attribute after the module's placeholder
    signed = with_signature(model)  # the same model, with the signature
    assert signature_parameters(signed.graph)["p_net_ln2_weight"] == "net.ln2.weight"
    named = {change.parameters for change in parameter_changes(signed)}
    assert named == {("net.ln2.weight", "net.ln2.bias"), ("net.head.weight", "net.head.bias")}
    assert parameter_changes(with_signature(exported_model(kept=True))) == []


def offset_weight_model(signed: bool) -> onnx.ModelProto:
    """Gemma's RMSNorm weight read as ``1 + w``, as ``optimize=True`` writes it: the FX node ``add_3`` folded into
    an initializer of its name, which the ``Mul`` of the FX node ``mul_5`` reads; ``net.norm.weight`` read by no node.
    ``signed``: with the exported program's signature."""
    call = "%{} : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = ({}), kwargs = {{}})"
    nodes = [_node("Mul", ["x", "add_3"], "y", "net.norm", call.format("mul_5", "%x, %add_3"))]
    graph = helper.make_graph(
        nodes,
        "exported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [_tensor("add_3", np.ones(4) + 0.5)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    if signed:
        lines = ["", "# inputs", "p_net_norm_weight: PARAMETER target='net.norm.weight'", "x: USER_INPUT"]
        model.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join(lines))
    return model


def test_a_weight_offset_by_a_constant_is_found_folded_into_its_reader() -> None:
    """The FX node that computed ``1 + w`` has no ONNX node left; its constant is found by the FX arguments of its
    readers, and paired with the parameter of their module that no node reads."""
    (change,) = parameter_changes(offset_weight_model(signed=True))
    assert (change.change, change.parameters, change.read_as, change.module) == (
        "folded",
        ("net.norm.weight",),
        ("add_3",),
        "net.norm",
    )
    with pytest.warns(TorchExportWarning, match=r"net\.norm\.weight read as add_3"):
        warn_changed_parameters(offset_weight_model(signed=True), ["add_3"])
    assert parameter_changes(offset_weight_model(signed=False)) == []  # no signature: no parameter to pair


def test_a_constant_that_may_come_from_a_buffer_is_not_said_to_be_a_parameter() -> None:
    """A module with a buffer no node reads (rotary frequencies folded into a table) may have computed the
    constant from it, not from its unread parameter: nothing is said."""
    model = offset_weight_model(signed=True)
    (signature,) = model.graph.metadata_props
    signature.value += "\nb_net_norm_freq: BUFFER target='net.norm.freq'"
    assert parameter_changes(model) == []


def test_a_model_without_the_exporters_metadata_or_with_other_names_has_no_change() -> None:
    model = exported_model(kept=False)
    for node in model.graph.node:
        del node.metadata_props[:]
    assert parameter_changes(model) == []
    renamed = exported_model(kept=False)
    for tensor in renamed.graph.initializer:
        tensor.name = f"renamed_{tensor.name}"
    for node in renamed.graph.node:
        node.input[:] = [f"renamed_{name}" if name.startswith(("net.", "val_")) else name for name in node.input]
    assert parameter_changes(renamed) == []


def test_generation_warns_where_a_trained_parameter_is_concerned() -> None:
    model = exported_model(kept=False)
    with pytest.warns(TorchExportWarning) as caught:
        warn_changed_parameters(model, ["net.ln1.weight", "val_7"])
    message = str(caught[0].message)
    assert "Merged" in message and "net.ln2.weight, net.ln2.bias read as net.ln1.weight, net.ln1.bias" in message
    assert "Folded" in message and "net.head.weight, net.head.bias read as val_7" in message
    assert "optimize=False" in message
    with pytest.warns(TorchExportWarning) as caught:  # the head is not trained: not named
        warn_changed_parameters(model, ["net.ln1.weight"])
    assert "val_7" not in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchExportWarning)
        warn_changed_parameters(model, [])  # nothing trained: nothing to say
        warn_changed_parameters(exported_model(kept=True), ["net.ln1.weight", "net.head.weight"])


def test_generate_artifacts_warns_and_explains_a_missing_parameter() -> None:
    model = exported_model(kept=False)
    loss = artifacts.LossType.MSELoss
    with pytest.warns(TorchExportWarning, match="Merged") as caught:
        artifacts.build_artifacts(model, requires_grad=artifacts.trainable_parameters(model), loss=loss)
    assert caught[0].filename == __file__  # the user's line, however deep onnxtrain raised it
    assert "folded it into val_7" in explain_missing(model, "net.head.weight")
    assert explain_missing(model, "net.ln1.weight") == ""
    with pytest.raises(ValueError, match=r"'net.ln2.weight', which is not an initializer .* merged it .* net.ln1"):
        artifacts.build_artifacts(model, requires_grad=["net.ln2.weight"], loss=loss)


@pytest.mark.parametrize(
    ("call", "training"),
    [
        ("_native_batch_norm_legit_functional", "%x, %p_w, %p_b, %b_mean, %b_var, True, 0.1, 1e-05"),
        ("_native_batch_norm_legit_functional", "%x, %p_w, %p_b, %b_mean, %b_var, False, 0.1, 1e-05"),
        ("batch_norm", "%x, %p_w, %p_b, %b_mean, %b_var, True, 0.1, 1e-05, True"),
        ("_native_batch_norm_legit_no_training", "%x, %p_w, %p_b, %b_mean, %b_var, 0.1, 1e-05"),
    ],
)
def test_a_batch_norm_says_whether_torch_ran_it_in_training_mode(call: str, training: str) -> None:
    """torch's ``training`` argument (the sixth; ``_no_training`` has none), read where the exporter wrote every
    batch norm in inference mode; ``None`` for a node of another call."""
    from onnxtrain.graph.torch_metadata import batch_norm_training

    fx = (
        f"%bn : [num_users=1] = call_function[target=torch.ops.aten.{call}.default](args = ({training}), kwargs = {{}})"
    )
    node = _node("BatchNormalization", ["x", "w", "b", "mean", "var"], "y", "net.bn", fx)
    assert batch_norm_training(node) is (call != "_native_batch_norm_legit_no_training" and ", True, 0.1" in training)
    other = "%r : [num_users=1] = call_function[target=torch.ops.aten.relu.default](args = (%x,), kwargs = {})"
    assert batch_norm_training(_node("Relu", ["x"], "y", "net.act", other)) is None
    assert batch_norm_training(helper.make_node("BatchNormalization", ["x", "w", "b", "m", "v"], ["y"])) is None


def test_a_weight_folded_again_for_each_use_is_said_to_train_untied() -> None:
    """ALBERT's shared layer, exported with ``optimize=True``: the transpose of its weight is folded once per
    use of the layer (``val_123``, ``val_197``, ``val_268``), and each copy trains on its use's gradient alone."""
    call = (
        "%{} : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%{}, %p_ffn_weight, "
        "%p_ffn_bias), kwargs = {{}})"
    )
    weight = np.arange(16.0).reshape(4, 4)
    nodes = [
        _node("MatMul", ["x", "val_1"], "m1", "ffn", call.format("linear", "x")),
        _node("Add", ["m1", "ffn.bias"], "h1", "ffn", call.format("linear", "x")),
        _node("MatMul", ["h1", "val_2"], "m2", "ffn", call.format("linear_1", "linear")),
        _node("Add", ["m2", "ffn.bias"], "y", "ffn", call.format("linear_1", "linear")),
    ]
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [_tensor("val_1", weight.T), _tensor("val_2", weight.T), _tensor("ffn.bias", np.ones(4))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    lines = ["", "# inputs", *(f"{placeholder(n)}: PARAMETER target='{n}'" for n in ("ffn.weight", "ffn.bias"))]
    lines += ["x: USER_INPUT"]
    model.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join(lines))
    with pytest.warns(TorchExportWarning, match=r"Untied, .*train apart.*: ffn\.weight as val_1, val_2\."):
        warn_changed_parameters(model, ["val_1", "val_2"])


def _two_norms(*, dynamo: bool, recorded: bool) -> onnx.ModelProto:
    """Two LayerNormalizations reading one scale, ``n1.weight`` (the optimizer's merge of a fresh model's equal
    weights), named as torch's dynamo exporter names nodes (``dynamo``) or as its TorchScript exporter does, with
    torch's node metadata (``recorded``) or none."""
    names = ("node_layer_norm", "node_layer_norm_1") if dynamo else ("/n1/LayerNormalization", "/n2/LayerNormalization")
    nodes = [
        helper.make_node("LayerNormalization", ["x", "n1.weight", "n1.bias"], ["h"], names[0], axis=-1),
        helper.make_node("LayerNormalization", ["h", "n1.weight", "n1.bias"], ["y"], names[1], axis=-1),
    ]
    if recorded:
        nodes[1].metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'n2']")
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [_tensor("n1.weight", np.ones(4, np.float32)), _tensor("n1.bias", np.zeros(4, np.float32))],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")


def test_an_optimized_export_whose_record_is_gone_is_said_where_nodes_share_a_parameter() -> None:
    """torch converts a dynamo export to opset 17 after writing it and drops its node metadata: the merges its
    optimizer made were trained tied without a word."""
    from onnxtrain.artifacts.exported_parameters import warn_unrecorded_merges

    with pytest.warns(TorchExportWarning, match=r"n1\.weight \(read by 2 LayerNormalizations\).*optimize=False"):
        warn_unrecorded_merges(_two_norms(dynamo=True, recorded=False), ["n1.weight", "n1.bias"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for model in (_two_norms(dynamo=False, recorded=False), _two_norms(dynamo=True, recorded=True)):
            warn_unrecorded_merges(model, ["n1.weight", "n1.bias"])  # TorchScript's (untied), or the record says
        warn_unrecorded_merges(_two_norms(dynamo=True, recorded=False), ["x"])  # nothing shared is trained


def test_a_fresh_torch_model_exported_at_opset_17_with_the_optimizer_is_said_to_train_tied(tmp_path) -> None:
    torch = pytest.importorskip("torch")

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.n1, self.b, self.n2 = (torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8),
                                                torch.nn.LayerNorm(8))  # fmt: skip

        def forward(self, x: object) -> object:
            return self.n2(self.b(self.n1(self.a(x))))

    for optimize in (True, False):
        path = tmp_path / f"two-{optimize}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Two(), (torch.randn(2, 8),), path, dynamo=True, optimize=optimize, opset_version=17)
        weights = artifacts.trainable_parameters(str(path))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            artifacts.generate_artifacts(str(path), requires_grad=weights, loss="MSELoss",
                                         artifact_directory=tmp_path / f"art-{optimize}")  # fmt: skip
        said = [w for w in caught if issubclass(w.category, TorchExportWarning)]
        assert bool(said) == optimize, [str(w.message) for w in said]


def _scatter(reduction: str | None, indices_from_data: bool) -> onnx.ModelProto:
    """``ScatterElements(zeros_like(x), dst, messages)``: a graph's messages summed at their destinations, the
    indices ``dst`` a graph input or an initializer."""
    attrs = {} if reduction is None else {"reduction": reduction}
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["messages"]),
        helper.make_node("Mul", ["x", "zero"], ["zeros"]),
        helper.make_node("ScatterElements", ["zeros", "dst", "messages"], ["y"], "scatter", axis=0, **attrs),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])]
    initializers = [_tensor("w", np.ones(3, np.float32)), _tensor("zero", np.zeros((), np.float32))]
    if indices_from_data:
        inputs.append(helper.make_tensor_value_info("dst", TensorProto.INT64, ["n", 3]))
    else:
        initializers.append(_tensor("dst", np.zeros((4, 3), np.int64)))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_scatter_without_a_reduction_at_indices_from_the_data_is_said() -> None:
    """torch's exporters write index_add_ (TorchScript), index_put_(accumulate=True) and scatter_reduce('mean')
    (dynamo) as scatters without a reduction: at a repeated index one update wins, where torch sums them."""
    from onnxtrain.artifacts import ScatterWarning
    from onnxtrain.artifacts.exported_parameters import warn_scatters

    for reduction in (None, "none"):
        with pytest.warns(ScatterWarning, match=r"scatter \(ScatterElements\): a scatter without a reduction"):
            warn_scatters(_scatter(reduction, indices_from_data=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_scatters(_scatter("add", indices_from_data=True))
        warn_scatters(_scatter(None, indices_from_data=False))  # fixed indices: the model's own


def test_a_parameter_the_forward_scatters_into_is_said_to_be_renormalized_as_torch_does_not_train_it() -> None:
    """nn.Embedding(max_norm=1.0) exported by dynamo: ``ScatterND(detach(weight), rows, renormalized)`` before the
    lookup. Its gradient went through the renormalization, torch's does not, and nothing said so."""
    from onnxtrain.artifacts import ScatterWarning
    from onnxtrain.artifacts.exported_parameters import warn_scatters

    nodes = [
        helper.make_node("Identity", ["emb.weight"], ["detach"]),
        helper.make_node("Unique", ["ids"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows", "last"], ["where"]),
        helper.make_node("Gather", ["detach", "rows"], ["picked"]),
        helper.make_node("Mul", ["picked", "half"], ["renormalized"]),
        helper.make_node("ScatterND", ["detach", "where", "renormalized"], ["renormed"], "renorm"),
        helper.make_node("Gather", ["renormed", "ids"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [_tensor("emb.weight", np.ones((5, 4), np.float32)), _tensor("half", np.array(0.5, np.float32)),
         _tensor("last", np.array([-1], np.int64))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_scatters(model)
    assert [w.category for w in caught] == [TorchExportWarning], [str(w.message) for w in caught]
    said = str(caught[0].message)
    assert said.startswith("emb.weight: the forward writes rows of this parameter") and "max_norm" in said
    assert not any(issubclass(w.category, ScatterWarning) for w in caught)


def test_a_parameter_folded_into_a_scalar_constant_is_said_and_explained() -> None:
    """CLIP's ``exp(logit_scale).clamp(max=100)``, folded by ``optimize=True`` into a rank-0 ``clamp`` that the
    roles call a constant: trained with ``trainable_parameters``, torch's temperature never trained, without a
    word; named, it was refused without the reason (scalars were not looked at)."""
    call = "%{} : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = ({}), kwargs = {{}})"
    nodes = [
        _node("MatMul", ["x", "proj.weight"], "h", "proj", call.format("mm", "%x, %p_proj_weight")),
        _node("Mul", ["h", "clamp"], "y", "", call.format("mul", "%mm, %clamp")),
    ]
    graph = helper.make_graph(
        nodes,
        "exported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [_tensor("proj.weight", np.ones((4, 4))), _tensor("clamp", np.array(14.3))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    lines = [
        "",
        "# inputs",
        "p_proj_weight: PARAMETER target='proj.weight'",
        "p_logit_scale: PARAMETER target='logit_scale'",
    ]
    model.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join([*lines, "x: USER_INPUT"]))
    assert artifacts.trainable_parameters(model) == ["proj.weight"]
    with pytest.warns(
        TorchExportWarning,
        match="not trained, so that torch's parameters do not train at all: logit_scale read as clamp",
    ):
        warn_changed_parameters(model, artifacts.trainable_parameters(model))
    assert "folded it into clamp" in explain_missing(model, "logit_scale")
