"""What each initializer of a model is, read from how its graph uses it: a weight, a constant, a running statistic.

An ONNX model does not say which of its initializers a framework trained.
torch's exports also store the attention scale, the mask's fill value and
Dropout's ratio as float initializers, and BatchNormalization's running mean
and variance beside its scale and bias. Training all float initializers
trains those too. The role of an initializer is read from the places the
graph reads it, after any ``Identity``, ``Cast`` or ``Transpose`` (an export
in training mode reads ``Linear``'s weight through a ``Transpose``), any
offset or scale by a constant (Gemma's RMSNorm multiplies by ``1 + w``) and
any ``Exp``, ``Neg`` or ``Clip`` (a decay stored as its logarithm: Mamba's
``-exp(A_log)``; Swin v2's clamped temperature) and any fake quantization
(``QuantizeLinear`` -> ``DequantizeLinear``, a QDQ model's float weight):

- **running statistic**: the mean or variance input (3, 4) of a
  ``BatchNormalization``. Never trained by the optimizer; a training-mode
  BatchNormalization updates it at each train step.
- **weight**: a float tensor in a parameter slot: either input of ``MatMul``,
  ``Gemm``'s ``A``, ``B`` and ``C``, an ``Einsum``'s operands, a convolution's weight and bias, a
  normalization's scale and bias, a recurrent layer's ``W``, ``R`` and ``B``,
  an embedding table (``Gather``'s or ``GatherND``'s data), ``PRelu``'s slope, the fused layers
  of ONNX Runtime's transformer optimizer; or an operand of an element-wise
  ``Add`` or ``Mul`` (the second of a ``Sub`` or ``Div``; the first of a
  ``Sub`` of more than one element: TensorFlow's batch normalization,
  ``beta - mean * scale``) whose other operand
  is computed from weights: a bias after ``MatMul`` (of one element too, for a
  single output), LayerNorm's decomposed scale and shift, a layer scale.
  There a rank-0 tensor is a constant (an attention scale, a fill value), and
  so is a single element that multiplies or divides (a sign, a temperature).
  Read through a view (``Expand``, ``Slice``, ``Unsqueeze``, ``Dropout``...:
  :data:`VIEWS`; a ``Concat`` of constant pieces, as LSTM's gates are
  reordered), a tensor is a weight only where it meets what the model
  computes: in a parameter slot beside what weights or the float inputs
  compute (``nn.MultiheadAttention``'s packed projection sliced into three,
  ``nn.LSTM``'s weights reordered into ``W``, ``R`` and ``B``,
  ``nn.PReLU``'s slope unsqueezed), in a ``Concat`` beside what weights
  compute (ViT's class token expanded and concatenated with the patch
  embeddings), added to a product (``MultiheadAttention``'s packed bias
  sliced; a convolution's bias after torch.ao's fused BatchNorm divided the
  convolution by its per-channel factor), sliced and added to what weights
  compute unless its values are the sines and cosines of a fixed position
  encoding (a learned position table added to the embeddings, not the
  Transformer's fixed one: :mod:`onnxtrain.graph.encodings`; a table whose
  values cannot be read stays a constant), multiplying what weights compute unless it is a slice (a layer
  scale unsqueezed onto the channels; a rotary table sliced to the sequence
  stays a constant), or scaling or shifting a normalization's output
  (``nn.GroupNorm``'s affine, exported as an ``InstanceNormalization``
  followed by its weight and bias unsqueezed). Resized (``Resize``: a
  position embedding interpolated to the image, BEiT's relative-position
  table), a tensor is a weight wherever it meets what weights compute or
  reaches a parameter slot: fixed tables are sliced, not resized. What
  weights compute is what their values compute: a shape read from it
  (``Shape``, ``Size``) is not.
  A float tensor that is the only value a graph output is computed from
  (shapes apart) is a weight: a parameter the model outputs for its loss, as
  a Gaussian policy's state-independent log standard deviation.
- **re-parametrised weight**: a float tensor from which a parameter slot's
  value is computed by arithmetic or a normalization on initializers alone
  (:data:`ARITHMETIC`, :data:`NORMALIZATIONS`), as
  ``torch.nn.utils.parametrizations.weight_norm`` computes a convolution's
  weight ``g * v / ||v||`` (wav2vec 2.0's positional convolution) and BiT's
  weight standardization normalizes each kernel.
- **constant**: everything else: integer and boolean tensors, scalars used as
  constants, Dropout's ratio, shapes, scales of ``Resize``, tensors read only
  by other operators or by views that meet no weight (a rotary embedding's
  frequencies through ``Unsqueeze``, into a product with the positions),
  tensors applied to the inputs before any weight (a converted scaler's
  offset and scale, an image normalization's mean and deviation), a constant
  minus a computed value (a converted classifier's ``1 - p``).

A tensor a ``Loop`` or ``Scan`` passes to its body is read where the body
reads it, at any depth: a tensor the body reads from the outer scope, a
``Loop``'s carried value or a ``Scan``'s state the body returns unchanged
(tf2onnx passes a Keras GRU's or SimpleRNN's kernels and bias so into its
``tf.while_loop``), a slice of a ``Scan``'s scanned input (a view). The
initial value of a state the body updates is no more than that: a constant.

A running statistic wins over a weight slot, and a weight slot over any
other use. Where torch's dynamo exporter wrote the exported program's
signature in the graph, it decides the other initializers it names: a
``PARAMETER`` is a weight (a rank-0 one too: CLIP's temperature), a
``BUFFER`` or ``CONSTANT_TENSOR`` a constant (BART's ``final_logits_bias``,
added to the logits as a bias is, which torch does not train); of the
initializers its optimizer made (``val_80``), one that only nodes computing
from buffers read (by the FX nodes they came from: buffers, no parameter) is
a buffer's value folded, a constant (GPT-J's rotary table ``val_125``,
indexed by position with ``GatherND`` as an embedding would be); and where
every parameter is accounted for (read under its name, or read as another
initializer where torch read it: ``q_proj.weight`` as its transpose
``val_27``), every other one is too (Llama's rotary tables folded at a fixed
sequence length, ``unsqueeze_14``, read where their folded FX node was). The
others keep the rules above.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Literal, NamedTuple

import onnx

from onnxtrain.graph import dtypes, torch_metadata, wire
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.encodings import Tables
from onnxtrain.graph.external import TensorData
from onnxtrain.graph.io import skeleton
from onnxtrain.graph.passes.retie import tie_transposed_copies, transposed_copies
from onnxtrain.graph.passes.untie import identity_copies, untie_identity_copies
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes, computed_from, readers_of, subgraphs

Role = Literal["weight", "constant", "running statistic"]

#: ``{(domain, operator): input positions that hold parameters}``; ``""`` is ai.onnx.
WEIGHT_SLOTS: Mapping[tuple[str, str], frozenset[int]] = {
    ("", "MatMul"): frozenset({0, 1}),
    ("", "Gemm"): frozenset({0, 1, 2}),
    ("", "Conv"): frozenset({1, 2}),
    ("", "ConvTranspose"): frozenset({1, 2}),
    ("", "BatchNormalization"): frozenset({1, 2}),
    ("", "LayerNormalization"): frozenset({1, 2}),
    ("", "InstanceNormalization"): frozenset({1, 2}),
    ("", "GroupNormalization"): frozenset({1, 2}),
    ("", "RMSNormalization"): frozenset({1}),
    ("", "RNN"): frozenset({1, 2, 3}),
    ("", "GRU"): frozenset({1, 2, 3}),
    ("", "LSTM"): frozenset({1, 2, 3, 7}),
    ("", "Gather"): frozenset({0}),
    ("", "GatherND"): frozenset({0}),  # a table looked up by index tuples (Whisper's positions, optimized)
    ("", "Einsum"): frozenset(range(16)),  # its operands, each of them (Funnel's relative-position kernels)
    ("", "PRelu"): frozenset({1}),
    ("com.microsoft", "FusedMatMul"): frozenset({0, 1}),
    ("com.microsoft", "Attention"): frozenset({1, 2}),
    ("com.microsoft", "MultiHeadAttention"): frozenset({3}),
    ("com.microsoft", "BiasGelu"): frozenset({1}),
    ("com.microsoft", "FastGelu"): frozenset({1}),
    ("com.microsoft", "SkipLayerNormalization"): frozenset({2, 3, 4}),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): frozenset({2, 3}),
    ("com.microsoft", "SimplifiedLayerNormalization"): frozenset({1}),
    ("com.microsoft", "LayerNormalization"): frozenset({1, 2}),
    ("com.microsoft", "EmbedLayerNormalization"): frozenset({2, 3, 4, 5, 6}),
}

#: Element-wise operators, with the input positions where a tensor beside a value computed from weights is one.
AFFINE: Mapping[str, frozenset[int]] = {
    "Add": frozenset({0, 1}),
    "Mul": frozenset({0, 1}),
    "Sub": frozenset({0, 1}),  # the minuend only where it has more than one element (see _elementwise_weight)
    "Div": frozenset({1}),
}
#: Of those, the operators that scale: a single element there is a constant (a sign, a temperature).
SCALING = frozenset({"Mul", "Div"})

#: Operators a weight may be read through before its slot (a view or a cast of it).
PASS_THROUGH = frozenset({"Identity", "Cast", "Transpose"})
#: Operators a weight may be read through as their first input, read where their result is: a decay stored as its
#: logarithm (Mamba's ``A = -exp(A_log)``, RWKV's ``-exp(time_decay)``), a bounded temperature (Swin v2's
#: ``exp(clamp(logit_scale, max=log 100))``), a fake quantization (``QuantizeLinear`` then ``DequantizeLinear``: a
#: QDQ model's float weight, as ``onnxruntime.quantization`` writes it for quantization-aware training).
MAPPED_THROUGH = frozenset({"Exp", "Neg", "Clip", "QuantizeLinear", "DequantizeLinear"})
#: Element-wise operators a weight may be read through when their other input is a constant, with the weight's
#: positions: ``w + c``, ``c + w``, ``w - c``, ``c - w``, ``w * c``, ``c * w``, ``w / c``.
OFFSET_OR_SCALE: Mapping[str, frozenset[int]] = {
    "Add": frozenset({0, 1}),
    "Sub": frozenset({0, 1}),
    "Mul": frozenset({0, 1}),
    "Div": frozenset({0}),
}

#: Operators that copy or re-shape their first input, a tensor read through them being a *view* of it: a weight
#: only where it meets what weights compute (a class token expanded and concatenated with patch embeddings, a
#: relative-position table sliced into a projection), never by its slot alone (a rotary embedding's frequencies
#: expanded into a product with the positions stay a constant). A ``Split``'s pieces are each a slice of it (the
#: biases of a Keras GRU, split in two inside tf2onnx's loop).
VIEWS = frozenset({"Expand", "Tile", "Slice", "Split", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Dropout"})

#: Operators that interpolate their first input, a tensor read through them being a *resized* view of it: a weight
#: wherever it meets what weights compute or reaches a parameter slot (ViT-family position embeddings interpolated
#: to the image, BEiT's relative-position table), as a fixed table (sinusoidal positions) is sliced, never resized.
RESAMPLING = frozenset({"Resize"})

#: Operators whose output depends on the shape of their input, not on its values.
SHAPE_ONLY = frozenset({"Shape", "Size"})

#: Operators that multiply their input by a weight (an added tensor beside their output is a bias).
PRODUCTS: Mapping[str, frozenset[str]] = {
    "": frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"}),
    "com.microsoft": frozenset({"FusedMatMul"}),
}
#: Normalizations (a tensor scaling or shifting their output is their affine weight or bias).
NORMALIZATIONS = frozenset({
    "BatchNormalization", "InstanceNormalization", "LayerNormalization", "GroupNormalization",
    "RMSNormalization", "MeanVarianceNormalization", "LpNormalization",
})  # fmt: skip
#: Operators that keep their first input's values in another shape: seen through to the operator that computed it.
RESHAPES = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Identity", "Cast"})
#: Operators through which a parameter slot's value computed from initializers alone re-parametrises them.
ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Sqrt", "Reciprocal", "Pow", "Exp", "ReduceL2"})
#: What a re-parametrised weight is followed back through: :data:`ARITHMETIC`, :data:`PASS_THROUGH`,
#: :data:`RESHAPES` and :data:`NORMALIZATIONS` (weight standardization: BiT normalizes each convolution's kernel
#: with a ``BatchNormalization`` of its reshaped weight).
_REPARAMETRISING = ARITHMETIC | PASS_THROUGH | RESHAPES | NORMALIZATIONS

#: BatchNormalization's inputs that hold its running statistics.
RUNNING_STATISTICS = frozenset({3, 4})


class Use(NamedTuple):
    """A place a node reads an initializer: ``node``'s input ``position``, the other input of a two-input node
    (else ``""``), whether the initializer reaches it through :data:`VIEWS` or :data:`RESAMPLING`, whether
    through :data:`RESAMPLING`, and whether through a ``Slice`` (a part of it)."""

    tensor: str
    node: onnx.NodeProto
    position: int
    other: str
    viewed: bool
    resized: bool = False
    sliced: bool = False


def initializer_roles(model: onnx.ModelProto | str | os.PathLike[str]) -> dict[str, Role]:
    """``{initializer: role}`` for every initializer of ``model`` (a path is read without external data), read as
    ``generate_artifacts`` reads the model: the parameters an exporter merged for their equal values untied
    (:func:`~onnxtrain.graph.passes.untie.untie_identity_copies`), the transposes it folded of a tied weight
    tied again (:func:`~onnxtrain.graph.passes.retie.tie_transposed_copies`: computed, no initializer)."""
    folder = None
    if not isinstance(model, onnx.ModelProto):  # its large inline weights refer to their bytes in the file, unread
        path = Path(model).resolve()
        folder, model = path.parent, wire.load_light(path)
    data = TensorData(base_dir=folder)
    tied = transposed_copies(model, data)
    tables = Tables.of(model, data)  # the values, which the copy below may not hold
    if tied or identity_copies(model):  # on a copy without the weights' values: the caller's model is not changed
        model = tie_transposed_copies(untie_identity_copies(skeleton(model)), copies=tied)
    return _roles(model, tables)


def _roles(model: onnx.ModelProto, tables: Tables) -> dict[str, Role]:
    """:func:`initializer_roles` of ``model`` as it is, the values of its tables read from ``tables``."""
    graph = model.graph
    tensors = {t.name: t for t in graph.initializer if dtypes.is_float(t.data_type)}
    stored = {t.name for t in graph.initializer}
    inputs = [value for value in graph.input if value.name not in stored]  # an old model lists both
    variable = _computed_from(graph, {value.name for value in inputs}, shapes=True)
    uses = list(_uses(graph, set(tensors), variable))
    statistics: set[str] = set()
    weights: set[str] = set()
    for use in uses:
        if use.viewed:
            continue
        node, position = use.node, use.position
        if node.op_type == "BatchNormalization" and is_standard(node) and position in RUNNING_STATISTICS:
            statistics.add(use.tensor)
        elif _in_weight_slot(node, position):
            weights.add(use.tensor)
    producers = {name: node for node in all_nodes(graph) for name in node.output if name}
    weights |= _reparametrised(graph, set(tensors), variable, producers)
    weights |= _output_alone(graph, set(tensors), stored, producers)
    weights -= statistics
    data = _computed_from(graph, {value.name for value in inputs if dtypes.is_float(value.type.tensor_type.elem_type)})
    while True:  # weights beside what the weights found so far compute, which may compute more
        computed = _computed_from(graph, weights)
        found = {
            use.tensor
            for use in uses
            if use.tensor not in weights | statistics
            and (
                _meets_weights(use, computed, data)
                or _viewed_elementwise_weight(use, tensors, producers, computed, data, tables)
                or (use.resized and _meets_weights_resized(use, computed))
                if use.viewed
                else _elementwise_weight(use.node, use.position, tensors[use.tensor], use.other in computed)
            )
        }
        if not found:
            break
        weights |= found
    kinds = torch_metadata.signature_kinds(graph)  # torch's own word, where its dynamo exporter wrote it
    folded = _folded_buffers(model, set(tensors) - set(kinds), kinds) if kinds else set()
    roles: dict[str, Role] = {}
    for tensor in graph.initializer:
        name, kind = tensor.name, kinds.get(tensor.name)
        if name in statistics:
            roles[name] = "running statistic"
        elif kind is not None and name in tensors:
            roles[name] = "weight" if kind == "PARAMETER" else "constant"
        elif name in folded:
            roles[name] = "constant"
        else:
            roles[name] = "weight" if name in weights else "constant"
    return roles


def _folded_buffers(model: onnx.ModelProto, made: set[str], kinds: Mapping[str, str]) -> set[str]:
    """Of ``made`` (float initializers torch's dynamo exporter's optimizer made), the buffers' values folded:

    - those whose every reader came from an FX node that read a buffer or lifted constant and no parameter;
    - where every torch parameter of the signature is read under its name, or read as another initializer by
      the ONNX nodes of an FX node that read it (:func:`~onnxtrain.graph.torch_metadata.parameter_changes`), all
      the others: a rotary table folded at a fixed sequence length is read where its FX node, folded too, was
      (``%unsqueeze_14``), by nodes that read no buffer either. A parameter read by no node may have been folded
      into any of them (``x @ w.t()`` as ``t``): then they keep the rules, as do those read by nodes the
      exporter wrote no FX node on.
    """
    graph = model.graph
    folded = set()
    readers = readers_of(all_nodes(graph))
    for name, nodes in readers.items():
        if name in made and all(
            torch_metadata.has_fx_node(node)
            and not torch_metadata.parameters_read(node)
            and torch_metadata.buffers_read(node)
            for node in nodes
        ):
            folded.add(name)
    changes = torch_metadata.parameter_changes(model, folded_away=False)
    found = {name for change in changes for name in change.parameters}
    parameters = [name for name, kind in kinds.items() if kind == "PARAMETER"]
    if parameters and all(name in readers or name in found for name in parameters):
        derived = {name for change in changes for name in change.read_as}
        described = {name for name in made - derived if all(map(torch_metadata.has_fx_node, readers.get(name, ())))}
        folded |= described
    return folded


def _elementwise_weight(node: onnx.NodeProto, position: int, tensor: onnx.TensorProto, beside_weights: bool) -> bool:
    """Whether ``tensor``, input ``position`` of element-wise ``node``, is a weight (see the module docstring)."""
    if not is_standard(node) or position not in AFFINE.get(node.op_type, frozenset()):
        return False
    if not beside_weights or not tensor.dims:
        return False
    if node.op_type == "Sub" and position == 0:  # TensorFlow's batch norm: beta - mean * scale; not a 1 - p
        return math.prod(tensor.dims) > 1
    return node.op_type not in SCALING or math.prod(tensor.dims) > 1


def _in_weight_slot(node: onnx.NodeProto, position: int) -> bool:
    """Whether input ``position`` of ``node`` holds a parameter (:data:`WEIGHT_SLOTS`)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    return position in WEIGHT_SLOTS.get((domain, node.op_type), frozenset())


def _meets_weights(use: Use, computed: set[str], data: set[str]) -> bool:
    """Whether a view of an initializer is read in a parameter slot beside an input in ``computed`` (what
    weights compute) or in ``data`` (what the float inputs compute), or by ``Concat`` beside one in
    ``computed``."""
    node = use.node
    if _in_weight_slot(node, use.position):
        met = computed | data
    elif node.op_type == "Concat" and is_standard(node):
        met = computed
    else:
        return False
    return any(name in met for k, name in enumerate(node.input) if k != use.position)


def _meets_weights_resized(use: Use, computed: set[str]) -> bool:
    """Whether a resized view of an initializer (:data:`RESAMPLING`) is read in a parameter slot, or by an
    element-wise :data:`AFFINE` node or a ``Concat`` beside a value in ``computed`` (what weights compute)."""
    node = use.node
    if _in_weight_slot(node, use.position):
        return True
    if not is_standard(node) or not (node.op_type == "Concat" or use.position in AFFINE.get(node.op_type, ())):
        return False
    return any(name in computed for k, name in enumerate(node.input) if k != use.position)


def _viewed_elementwise_weight(
    use: Use,
    tensors: Mapping[str, onnx.TensorProto],
    producers: Mapping[str, onnx.NodeProto],
    computed: set[str],
    data: set[str],
    tables: Tables,
) -> bool:
    """Whether a view of an initializer of ``tensors`` read by an element-wise node is a weight: added to (or
    subtracted from) a product of what weights compute (``computed``), multiplying what weights compute unless
    sliced (a layer scale unsqueezed to the channels), or scaling or shifting a normalization's output (or what
    it minus its pooling gives, PoolFormer's token mixer), of weights' values or the float inputs' (``data``).
    A table sliced and added to what weights compute (positions added to embeddings) is a weight unless its
    values are a fixed sinusoidal encoding or an additive mask (:mod:`onnxtrain.graph.encodings`; a mask
    sliced and added to attention scores, a product, stays a constant too), or cannot be read. Rotary tables
    sliced and multiplying a projection, and tensors unsqueezed to scale the inputs (an image normalization)
    stay constants."""
    node = use.node
    source = _through_reshapes(use.other, producers)
    if use.other in computed | data and _normalized(source, producers, tensors.keys()):
        beside = node.op_type in ("Add", "Sub", "Mul")
    elif node.op_type == "Mul" and not use.sliced:  # a whole tensor (not a slice of a table) scaling what weights
        beside = use.other in computed  # compute: a layer scale, Mamba's skip weight D, its decay -exp(A_log)
    else:  # a bias added to a product, maybe scaled per channel by what weights compute (torch.ao's ConvBn)
        beside = use.other in computed and node.op_type in ("Add", "Sub") and source is not None
        product = beside and (_is_product(source) or _scaled_product(source, producers, data))
        fixed = tables.fixed(use.tensor) if beside and use.sliced else None  # a table sliced to the sequence
        beside = (product and fixed is not True) or (beside and use.sliced and fixed is False)
    return beside and _elementwise_weight(node, use.position, tensors[use.tensor], True)


def _scaled_product(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto], data: set[str]) -> bool:
    """Whether ``node`` multiplies or divides a product by what the float inputs do not compute: torch.ao's fused
    convolution and BatchNorm for quantization-aware training divides its convolution by the normalization's
    per-channel factor before adding the convolution's bias."""
    if node.op_type not in SCALING or not is_standard(node) or len(node.input) != 2:
        return False
    product, factor = node.input
    source = _through_reshapes(product, producers)
    return source is not None and _is_product(source) and factor not in data


def _through_reshapes(value: str, producers: Mapping[str, onnx.NodeProto]) -> onnx.NodeProto | None:
    """The node that computed ``value``, seen through :data:`RESHAPES`; ``None`` for an input or initializer."""
    node = producers.get(value)
    while node is not None and node.op_type in RESHAPES and is_standard(node) and node.input:
        node = producers.get(node.input[0])
    return node


def _is_product(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is one of :data:`PRODUCTS`."""
    return node.op_type in PRODUCTS.get("" if node.domain == "ai.onnx" else node.domain, frozenset())


def _normalized(
    node: onnx.NodeProto | None, producers: Mapping[str, onnx.NodeProto], stored: AbstractSet[str], depth: int = 4
) -> bool:
    """Whether ``node`` is a normalization whose scale is not an initializer of ``stored`` (its affine comes
    after it: torch exports GroupNorm as an ``InstanceNormalization`` by constant ones), or scales or shifts
    what one computed (its affine so far: GroupNorm's bias is added to the normalized value times its
    weight)."""
    if node is None or not is_standard(node):
        return False
    if node.op_type in NORMALIZATIONS:
        return len(node.input) < 2 or node.input[1] not in stored
    return (
        depth > 0
        and node.op_type in ("Mul", "Add", "Sub")
        and any(_normalized(_through_reshapes(name, producers), producers, stored, depth - 1) for name in node.input)
    )


def _reparametrised(
    graph: onnx.GraphProto, floats: set[str], variable: set[str], producers: Mapping[str, onnx.NodeProto]
) -> set[str]:
    """The float initializers (of one element or more, not rank 0) from which a parameter slot's value is
    computed by :data:`ARITHMETIC` (and :data:`PASS_THROUGH`, :data:`RESHAPES`, :data:`NORMALIZATIONS`) on
    initializers and constants alone: a weight written as a function of the parameters a framework trains
    (weight normalization's ``g * v / ||v||``, weight standardization's normalized kernel)."""
    found: set[str] = set()
    for node in all_nodes(graph):
        for position, value in enumerate(node.input):
            if not value or value in variable or not _in_weight_slot(node, position):
                continue
            pending, seen, reached = [(value, False)], {value}, set()
            while pending:  # (a value, whether it is computed from what comes before it, not only reshaped)
                current, computing = pending.pop()
                maker = producers.get(current)
                if maker is None or not is_standard(maker) or maker.op_type not in _REPARAMETRISING:
                    continue
                computing = computing or maker.op_type in ARITHMETIC | NORMALIZATIONS
                for name in maker.input:
                    if name in floats and computing:  # only reshaped: a view, whose rules are those above
                        reached.add(name)
                    elif name and name not in seen:
                        seen.add(name)
                        pending.append((name, computing))
            found |= reached
    dims = {t.name: t.dims for t in graph.initializer}
    return {name for name in found if dims[name]}


def _output_alone(
    graph: onnx.GraphProto, floats: set[str], stored: set[str], producers: Mapping[str, onnx.NodeProto]
) -> set[str]:
    """The float initializers each of which is the only value a graph output is computed from, the inputs'
    shapes apart: a parameter the model outputs for its loss, as a Gaussian policy's log standard deviation
    (``log_std``; CleanRL's ``exp(log_std.expand_as(mean))``, stable-baselines3's ``ones_like(mean) *
    log_std.exp()``) or the learned task weights of a multi-task loss. Read nowhere beside weights or data, such
    a tensor met none of the rules above."""
    found: set[str] = set()
    for output in graph.output:
        sources: set[str] = set()
        pending, seen = [output.name], {output.name}
        while pending and len(sources) < 2:
            value = pending.pop()
            node = producers.get(value)
            if node is None:  # a float initializer or an input: what the output's value is computed from
                if value not in stored or value in floats:
                    sources.add(value if value in stored else "")
                continue
            if node.op_type in SHAPE_ONLY and is_standard(node):
                continue
            for name in _reads(node):
                if name not in seen:
                    seen.add(name)
                    pending.append(name)
        if len(sources) == 1 and not pending and (alone := next(iter(sources))) in floats:
            found.add(alone)
    return found


def _computed_from(graph: onnx.GraphProto, sources: set[str], *, shapes: bool = False) -> set[str]:
    """The values computed from the values of ``sources``, at any distance (not from their shapes alone:
    :data:`SHAPE_ONLY`, unless ``shapes``); a node with subgraphs computes its outputs from everything they
    read, and a ``Loop``'s or ``Scan``'s body input from what enters it and what the body returns for it
    (:func:`_carried`)."""
    edges: list[tuple[AbstractSet[str], list[str]]] = []
    for node in all_nodes(graph):
        if shapes or not (node.op_type in SHAPE_ONLY and is_standard(node)):
            edges.append((_reads(node), list(node.output)))
        for carried in _carried(node):  # a body's input holds what enters the loop, then what the body returned
            edges.append(({carried.outer, carried.returned} - {""}, [carried.inner]))
    return computed_from(sources, edges)


class _Carried(NamedTuple):
    """A value a ``Loop`` or ``Scan`` passes to its body: the node's input ``position`` (``outer``), the body's
    input that receives it (``inner``), the body's output that carries it to the next iteration (``returned``;
    ``""`` for a scanned input, of which the body receives a slice at each iteration), and whether that output
    is the input unchanged (``invariant``: a weight tf2onnx passes through a ``tf.while_loop``)."""

    position: int
    outer: str
    inner: str
    returned: str
    invariant: bool


def _carried(node: onnx.NodeProto) -> list[_Carried]:
    """The values ``node`` passes to its body, if it is a ``Loop`` (its carried values ``v_initial``: input ``k``
    to body input ``k``, returned as body output ``k - 1``) or a ``Scan`` (its states, then its scanned inputs:
    input ``k`` to body input ``k``, after opset 8's ``sequence_lens``; state ``k`` returned as body output
    ``k``); ``[]`` for any other node."""
    if not is_standard(node) or node.op_type not in ("Loop", "Scan"):
        return []
    body = attribute(node, "body")
    if not isinstance(body, onnx.GraphProto):
        return []
    inner = [value.name for value in body.input]
    returned = [value.name for value in body.output]
    if node.op_type == "Loop":
        pairs = [(k, k, k - 1) for k in range(2, min(len(node.input), len(inner)))]
    else:
        scanned = attribute(node, "num_scan_inputs", 0)
        states, offset = len(inner) - scanned, len(node.input) - len(inner)
        pairs = [(k + offset, k, k if k < states else -1) for k in range(len(inner)) if k + offset >= 0]
    found = []
    for position, k, out in pairs:
        if position < len(node.input) and node.input[position]:
            back = returned[out] if 0 <= out < len(returned) else ""
            found.append(_Carried(position, node.input[position], inner[k], back, _unchanged(body, inner[k], back)))
    return found


def _unchanged(body: onnx.GraphProto, inner: str, returned: str) -> bool:
    """Whether ``body`` returns its input ``inner`` as its output ``returned``, as it is or through ``Identity``."""
    producers = {name: node for node in body.node for name in node.output if name}
    seen: set[str] = set()
    while returned and returned != inner and returned not in seen:
        seen.add(returned)
        node = producers.get(returned)
        if node is None or node.op_type != "Identity" or not is_standard(node) or not node.input:
            return False
        returned = node.input[0]
    return bool(returned) and returned == inner


def _reads(node: onnx.NodeProto) -> set[str]:
    """The inputs of ``node`` and of every node of its subgraphs."""
    read = {name for name in node.input if name}
    for subgraph in subgraphs(node):
        read.update(name for inner in all_nodes(subgraph) for name in inner.input if name)
    return read


def trainable_parameters(model: onnx.ModelProto | str | os.PathLike[str]) -> list[str]:
    """The initializers of ``model`` that are weights (:func:`initializer_roles`), in initializer order: what
    ``requires_grad`` should name to train the whole model."""
    return [name for name, role in initializer_roles(model).items() if role == "weight"]


def running_statistics(model: onnx.ModelProto) -> list[str]:
    """The initializers of ``model`` as it is (generation's, untied and tied again: :func:`initializer_roles`)
    that are BatchNormalization running statistics, in initializer order."""
    return [name for name, role in _roles(model, Tables.of(model, TensorData())).items() if role == "running statistic"]


def _uses(graph: onnx.GraphProto, tensors: set[str], variable: set[str]) -> Iterator[Use]:
    """Each place a node reads one of ``tensors``, directly or through :data:`PASS_THROUGH` operators, offsets
    or scales by constants (:func:`_shifted_by_constant`), :data:`VIEWS` (the first input of each) and
    ``Concat``s of pieces none of which is ``variable`` (computed from the graph's inputs): views too, each
    also a use."""
    readers = readers_of(all_nodes(graph))
    constants = {t.name for t in graph.initializer}
    constants.update(
        name for node in all_nodes(graph) if node.op_type == "Constant" and is_standard(node) for name in node.output
    )
    for tensor in tensors:
        start = (tensor, False, False, False)
        frontier, seen = [start], {start}  # a value reached again another way is read again
        while frontier:
            value, viewed, resized, sliced = frontier.pop()
            for node in readers.get(value, ()):
                mapped = node.op_type in MAPPED_THROUGH and node.input[0] == value
                through = (is_standard(node) and (node.op_type in PASS_THROUGH or mapped)) or _shifted_by_constant(
                    node, value, constants
                )
                resizes = node.op_type in RESAMPLING and is_standard(node) and node.input[0] == value
                view = resizes or (node.op_type in VIEWS and is_standard(node) and node.input[0] == value)
                if _joins_constants(node, variable) or (resized and node.op_type == "Concat" and is_standard(node)):
                    yield from (
                        Use(tensor, node, k, "", viewed, resized, sliced)
                        for k, name in enumerate(node.input)
                        if name == value
                    )
                    view = True
                if through or view:
                    for out in node.output[:1] if view and node.op_type != "Split" else node.output:
                        slices = view and node.op_type in ("Slice", "Split")
                        reached = (out, viewed or view, resized or resizes, sliced or slices)
                        if out and reached not in seen:
                            seen.add(reached)
                            frontier.append(reached)
                    continue
                inside = {c.position: c for c in _carried(node) if c.returned == "" or c.invariant}
                for position, name in enumerate(node.input):
                    if name == value and position in inside:  # followed into the body, read where it is read
                        scanned = inside[position].returned == ""  # a slice of it at each iteration
                        reached = (inside[position].inner, viewed or scanned, resized, sliced or scanned)
                        if reached not in seen:
                            seen.add(reached)
                            frontier.append(reached)
                    elif name == value:
                        other = node.input[1 - position] if len(node.input) == 2 and position < 2 else ""
                        yield Use(tensor, node, position, other, viewed, resized, sliced)


def _joins_constants(node: onnx.NodeProto, variable: set[str]) -> bool:
    """Whether ``node`` is a ``Concat`` of pieces none of which the graph's inputs compute (a weight cut and
    joined again: the gates of a recurrent layer reordered)."""
    return node.op_type == "Concat" and is_standard(node) and not any(name in variable for name in node.input)


def _shifted_by_constant(node: onnx.NodeProto, value: str, constants: set[str]) -> bool:
    """Whether ``node`` computes ``value`` plus, minus, times or over a constant (an initializer or a ``Constant``):
    a weight re-parametrised (Gemma's norms scale by ``1 + w``), read where the result is."""
    if not is_standard(node) or node.op_type not in OFFSET_OR_SCALE or len(node.input) != 2:
        return False
    position = list(node.input).index(value)
    other = node.input[1 - position]
    return position in OFFSET_OR_SCALE[node.op_type] and other != value and other in constants


__all__ = [
    "AFFINE",
    "ARITHMETIC",
    "MAPPED_THROUGH",
    "NORMALIZATIONS",
    "OFFSET_OR_SCALE",
    "PASS_THROUGH",
    "PRODUCTS",
    "RESAMPLING",
    "RESHAPES",
    "SCALING",
    "SHAPE_ONLY",
    "VIEWS",
    "WEIGHT_SLOTS",
    "Role",
    "Use",
    "initializer_roles",
    "running_statistics",
    "trainable_parameters",
]
