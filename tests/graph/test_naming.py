"""Names for what a build or a merge adds."""

from __future__ import annotations

from onnxtrain.graph.naming import keep_or_tag, unknown_name_hint


def test_keep_or_tag_keeps_free_names_and_tags_taken_ones_with_the_first_free_number():
    taken = {"w", "w.fused0", "x"}
    give = keep_or_tag(taken, "fused")
    assert give("y") == "y"  # free: kept
    assert give("w") == "w.fused1"  # w and w.fused0 are taken
    assert give("w") == "w.fused2"  # what it gave is taken now
    assert give("y") == "y.fused0"
    assert taken == {"w", "w.fused0", "w.fused1", "w.fused2", "x", "y", "y.fused0"}


def test_an_unknown_name_gets_the_closest_known_ones_and_a_short_listing():
    known = [f"model.layers.{i}.mlp.weight" for i in range(148)]
    hint = unknown_name_hint("model.layers.7.mlp.weigth", known)
    assert hint.startswith("did you mean 'model.layers.7.mlp.weight'")
    assert "the 148 known: 'model.layers.0.mlp.weight'" in hint and hint.endswith(" and 138 more")
    assert unknown_name_hint("zzz", ["a", "b"]) == "the 2 known: 'a', 'b'"  # nothing close, all listed
    assert unknown_name_hint(("a", 1), ["a"]).startswith("names are str, not tuple")
