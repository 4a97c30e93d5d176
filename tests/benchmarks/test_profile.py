"""``benchmarks.real_size.profile``: onnxruntime's profiles of the runtime's sessions, and the GPU's trace, summed.

Timings are never asserted: the counts are (runs, nodes per run, kernels per
step, the union of overlapping spans).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.real_size import profile
from onnxtrain.api import CheckpointState, Module, Optimizer


def _train(directory: Path, steps: int) -> None:
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    optimizer = Optimizer(str(directory / "optimizer_model.onnx"), module)
    x, y = np.ones((4, 10), np.float32), np.zeros((4, 1), np.float32)
    for _ in range(steps):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()


def test_every_session_profiles_and_the_fused_step_is_the_one_that_ran_most(
    linear_artifacts: Path, tmp_path: Path
) -> None:
    with profile.profiled_sessions(tmp_path) as files:
        _train(linear_artifacts, steps=6)
    assert files and all(path.parent == tmp_path for path in files)
    for path in files:  # each ended: a whole JSON array
        assert isinstance(json.loads(path.read_text()), list)
    runs = {path: profile.read_runs(path) for path in files}
    fused = max(runs.values(), key=len)
    assert len(fused) == 5  # the first step runs the reset step's session, every later one the fused step
    assert all(run["nodes"] and run["wall_us"] > 0 for run in fused)
    summary = profile.fused_step_profile(files, skip=1, tail=1)
    assert summary["runs"] == 3 and summary["sessions"] == len(files)
    per_run = len(fused[-1]["nodes"])
    assert summary["nodes_per_run"] == per_run == sum(summary["nodes_per_run_by_provider"].values())
    assert summary["nodes_per_run_by_provider"] == {"CPUExecutionProvider": per_run}
    assert summary["memcpy_per_run"] == {}  # nothing to copy on the CPU
    assert sum(kind["per_run"] for kind in summary["kinds"]) == per_run
    assert sum(kind["share"] for kind in summary["kinds"]) == pytest.approx(1.0)
    assert any(kind["op"] == "Gemm" for kind in summary["kinds"])
    assert len(summary["slowest_nodes"]) == min(profile.LISTED, per_run)
    text = profile.render("linear", "4x10", {"device": "cpu", "profile": summary, "kernels": {}})
    assert "| operator | provider | nodes per run | ms per run | share |" in text and "| Gemm |" in text
    assert "GPU kernels: not measured" in text
    # the patch is gone once the block ends: a later module opens plain sessions
    _train(linear_artifacts, steps=2)
    assert sorted(tmp_path.glob("session-*.json")) == sorted(files)


def test_runs_to_leave_out_never_leave_none() -> None:
    runs = [{"wall_us": 1000.0, "nodes": [("a", "Add", "CPUExecutionProvider", 10.0)]}] * 2
    assert profile.summarize_runs(runs, skip=5)["runs"] == 2
    assert profile.summarize_runs([], skip=0) == {"runs": 0}
    assert profile.fused_step_profile([], skip=0)["runs"] == 0


def test_node_events_are_given_to_the_run_that_holds_them(tmp_path: Path) -> None:
    def node(name: str, ts: float, dur: float, provider: str = "CUDAExecutionProvider") -> dict:
        args = {"op_name": name.split("_")[0], "provider": provider}
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "ph": "X", "args": args}

    events = [
        {"cat": "Session", "name": "model_run", "ts": 100.0, "dur": 50.0, "ph": "X"},
        {"cat": "Session", "name": "model_run", "ts": 200.0, "dur": 60.0, "ph": "X"},
        node("Gemm_1", 105, 10),
        node("MemcpyToHost_2", 120, 30),  # the slowest node per run: 15 µs against the Gemm's 11
        node("Gemm_1", 205, 12),
        node("Shape_3", 230, 1, "CPUExecutionProvider"),
        node("Gemm_9", 170, 5),  # between the runs (a session's own work): no run's
        node("Gemm_9", 90, 5),  # before the first run
    ]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(events))
    runs = profile.read_runs(path)
    assert [run["wall_us"] for run in runs] == [50.0, 60.0]
    assert [[n[0] for n in run["nodes"]] for run in runs] == [["Gemm_1", "MemcpyToHost_2"], ["Gemm_1", "Shape_3"]]
    summary = profile.summarize_runs(runs, skip=0)
    assert summary["memcpy_per_run"] == {"MemcpyToHost (CUDAExecutionProvider)": 0.5}
    assert summary["nodes_per_run_by_provider"] == {"CPUExecutionProvider": 0.5, "CUDAExecutionProvider": 1.5}
    assert summary["slowest_nodes"][0] == {
        "node": "MemcpyToHost_2",
        "op": "MemcpyToHost",
        "provider": "CUDAExecutionProvider",
        "ms_per_run": 0.015,
    }


def test_the_gpu_busy_time_is_the_union_of_the_device_s_spans() -> None:
    def event(cat: str, name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    trace = {
        "traceEvents": [
            event("kernel", "gemm", 0, 100),
            event("kernel", "add", 150, 10),
            event("gpu_memcpy", "Memcpy HtoD", 155, 20),  # overlaps the add: busy 150-175
            event("kernel", "gemm", 300, 100),
            event("cuda_runtime", "cudaLaunchKernel", 0, 5),  # the host's: not the device's
            event("cpu_op", "aten::mm", 0, 400),
        ]
    }
    summary = profile.kernel_summary(trace, steps=2, wall_s=0.001)
    assert summary["kernels_per_step"] == 1.5 and summary["activities_per_step"] == 2
    assert summary["device_ms_per_step"] == pytest.approx(0.115)
    assert summary["busy_ms_per_step"] == pytest.approx(0.1125)  # (100 + 25 + 100) / 2 µs
    assert summary["busy_share"] == pytest.approx(0.225)
    assert summary["top"][0] == {"kernel": "kernel: gemm", "per_step": 1.0, "ms_per_step": 0.1}
    text = profile.render("m", "1x1", {"device": "cuda", "profile": {"runs": 0}, "kernels": summary})
    assert "busy 0.1 ms of the 0.5 ms wall (22%)" in text and "| `kernel: gemm` | 1 | 0.10 |" in text


def test_the_profile_command_runs_the_tiny_gpt2(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    argv = ["--workload", "gpt2-tiny", "--shapes", "2x8", "--warmup", "2", "--steps", "2"]
    assert profile.main([*argv, "--workdir", str(tmp_path / "work"), "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "profile-gpt2-tiny.json").read_text())
    assert result["framework"] == "onnxtrain" and result["profile"]["runs"] == 2
    assert result["profile"]["nodes_per_run"] > 100 and "kernels" not in result  # no GPU here
    assert "## gpt2-tiny, 2x8, cpu" in (tmp_path / "profile-gpt2-tiny.md").read_text()
    with pytest.raises(SystemExit):
        profile.main(["--shapes", "2x8,4x8", "--out", str(tmp_path)])
