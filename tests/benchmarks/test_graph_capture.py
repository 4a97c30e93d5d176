"""``benchmarks.real_size.graph_capture``: the fused step bound once by pointer and timed, launched and captured.

No CUDA here: the launched session alone runs, which checks the harness (the
model as the runtime runs it on a GPU, the bindings in place, the copies of a
new batch, rate and step number). Timings are never asserted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.real_size import graph_capture

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_launched_step_runs_the_packed_folded_model_in_place(tmp_path: Path) -> None:
    argv = ["--workload", "gpt2-tiny", "--shapes", "2x8", "--device", "cpu", "--warmup", "1", "--steps", "2"]
    assert graph_capture.main([*argv, "--workdir", str(tmp_path / "work"), "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "graph-capture-gpt2-tiny.json").read_text())
    launched = result["launched"]
    assert launched["steps"] == 2 and launched["placed"]["nodes"] > 100 and launched["placed"]["memcpy"] == 0
    assert "captured" not in result and "ratio" not in result  # no CUDA here
    assert math.isfinite(launched["loss"])
    assert "| launched |" in (tmp_path / "graph-capture-gpt2-tiny.md").read_text()


def test_the_step_model_binds_the_packed_tensors_as_rows_and_writes_them_in_place(tmp_path: Path) -> None:
    from benchmarks.real_size.__main__ import prepared
    from benchmarks.real_size.worker import artifact_folder

    folder, _ = prepared("gpt2-tiny", tmp_path)
    model, shapes, in_place, user_inputs = graph_capture.step_model(artifact_folder(folder, "fp32"), 2, 8)
    declared = {value.name: tuple(d.dim_value for d in value.type.tensor_type.shape.dim) for value in model.graph.input}
    assert [declared[name] for name in user_inputs] == [(2, 8), (16,)]  # the batch's shapes, folded
    assert all(math.prod(shapes[name]) == math.prod(declared[name]) for name in declared)
    outputs = {value.name for value in model.graph.output}
    assert set(in_place) <= outputs and set(in_place.values()) <= set(declared)
    rows = [shapes[name] for name in in_place.values() if len(shapes[name]) == 2]
    assert len({width for _, width in rows}) == 1  # the packed tensors: rows of one width
    values = graph_capture.initial_values(
        model, shapes, artifact_folder(folder, "fp32") / "checkpoint", {n: np.zeros(declared[n]) for n in user_inputs}
    )
    assert set(values) == set(declared) and all(values[n].shape == shapes[n] for n in declared)
