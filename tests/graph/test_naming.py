"""Names for what a build or a merge adds."""

from __future__ import annotations

from onnxtrain.graph.naming import keep_or_tag


def test_keep_or_tag_keeps_free_names_and_tags_taken_ones_with_the_first_free_number():
    taken = {"w", "w.fused0", "x"}
    give = keep_or_tag(taken, "fused")
    assert give("y") == "y"  # free: kept
    assert give("w") == "w.fused1"  # w and w.fused0 are taken
    assert give("w") == "w.fused2"  # what it gave is taken now
    assert give("y") == "y.fused0"
    assert taken == {"w", "w.fused0", "w.fused1", "w.fused2", "x", "y", "y.fused0"}
