"""Graph rewrites, each a small pass with one signature: ``pass_(model, **options) -> model``.

A pass rewrites the model it is given, in place, and returns it; it computes
what it computed before (the same outputs, under the same names). Its
options are keyword-only; ``fixed=k`` marks the graph's first ``k`` nodes
(the forward graph a gradient is drafted after) as read-only. Callers that
need the model as it was copy it first.

- :func:`~onnxtrain.graph.passes.duplicates.merge_duplicates`: common-subexpression merging;
- :func:`~onnxtrain.graph.passes.transposes.fold_transposes`: stacked transposes folded;
- :func:`~onnxtrain.graph.passes.unused.prune_unused_nodes`: nodes no output needs removed;
- :func:`~onnxtrain.graph.passes.unused.drop_unread_initializers`: initializers nothing reads removed;
- :func:`~onnxtrain.graph.passes.static_shapes.fold_static_shapes`: fixed input shapes, shape computations folded;
- :func:`~onnxtrain.graph.passes.constants.fold_constants`: nodes of small constants made ``Constant`` nodes;
- :func:`~onnxtrain.graph.passes.shapes_early.read_shapes_early`: shapes read right after their values are made;
- :func:`~onnxtrain.graph.passes.identities.replace_dropout_masks`: in an eval model, a torch dropout module's
  product by its random mask made an identity;
- :func:`~onnxtrain.graph.passes.identities.replace_identity_dropouts`: dropouts that drop nothing made identities,
  and :func:`~onnxtrain.graph.passes.identities.replace_zero_pads`: pads of zeros;
- :func:`~onnxtrain.graph.passes.pad_fusion.fuse_pads_into_convs`: pads of zeros before convolutions made their pads;
- :func:`~onnxtrain.graph.passes.untie.untie_identity_copies`: parameters an exporter merged for their equal values
  given their own initializers, and :func:`~onnxtrain.graph.passes.retie.tie_transposed_copies`: a tied weight's
  transpose that it folded into a constant read as computed again;
- :func:`~onnxtrain.graph.passes.cast_like.cast_like_to_cast`: ``CastLike`` of a known type made a ``Cast``;
- :func:`~onnxtrain.graph.passes.recompute.recompute_elementwise`: element-wise activations recomputed, not kept;
- :func:`~onnxtrain.graph.passes.recompute.recompute_from_checkpoints`: activation checkpointing, every activation
  the backward reads recomputed from chosen ones
  (:func:`~onnxtrain.graph.passes.checkpoint_choice.choose_checkpoints` chooses the layer boundaries; the copies
  wait for the backward through :func:`~onnxtrain.graph.passes.hold_back.hold_copies`);
- :func:`~onnxtrain.graph.passes.functions.expand_loss_functions`: loss functions written out as their bodies, in
  their place (onnxruntime would add them last);
- :func:`~onnxtrain.graph.passes.autocast.autocast`: a float32 forward computing in a half type where safe, and
  :func:`~onnxtrain.graph.passes.autocast.accumulate_in_float32`: half scatters that add, adding in float32
  (import them from their module: they type the graph with ``GraphBuilder``, which imports this package).

Label-check stripping (:func:`onnxtrain.losses.label_check.strip_label_checks`)
has the same signature; it lives with the label checks, whose nodes it knows.
"""

from __future__ import annotations

from onnxtrain.graph.passes.constants import fold_constants
from onnxtrain.graph.passes.duplicates import merge_duplicates
from onnxtrain.graph.passes.functions import expand_loss_functions
from onnxtrain.graph.passes.identities import replace_dropout_masks, replace_identity_dropouts, replace_zero_pads
from onnxtrain.graph.passes.pad_fusion import fuse_pads_into_convs
from onnxtrain.graph.passes.recompute import recompute_elementwise, recompute_from_checkpoints
from onnxtrain.graph.passes.retie import tie_transposed_copies
from onnxtrain.graph.passes.shapes_early import read_shapes_early
from onnxtrain.graph.passes.static_shapes import fold_static_shapes
from onnxtrain.graph.passes.transposes import fold_transposes
from onnxtrain.graph.passes.untie import untie_identity_copies
from onnxtrain.graph.passes.unused import drop_unread_initializers, prune_unused_nodes

__all__ = [
    "drop_unread_initializers",
    "expand_loss_functions",
    "fold_constants",
    "fold_static_shapes",
    "fold_transposes",
    "fuse_pads_into_convs",
    "merge_duplicates",
    "prune_unused_nodes",
    "read_shapes_early",
    "recompute_elementwise",
    "recompute_from_checkpoints",
    "replace_dropout_masks",
    "replace_identity_dropouts",
    "replace_zero_pads",
    "tie_transposed_copies",
    "untie_identity_copies",
]
