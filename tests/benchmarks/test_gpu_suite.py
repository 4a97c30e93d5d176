"""``benchmarks.real_size.gpu_suite``: the GPU runs the real-size work leaves open, as one call."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.real_size import gpu_suite, graph_capture, profile
from benchmarks.real_size.__main__ import arguments


def _parsed(command: list[str]) -> argparse.Namespace:
    """``command``'s arguments as its module's own parser takes them."""
    if command[2] == gpu_suite.PROFILE_MODULE:
        return profile.arguments().parse_args(command[3:])
    if command[2] == gpu_suite.GRAPH_CAPTURE_MODULE:
        return graph_capture.arguments().parse_args(command[3:])
    assert command[1:3] == ["-m", "benchmarks.real_size"]
    return arguments().parse_args(command[3:])


def test_every_command_is_one_its_module_accepts(tmp_path: Path) -> None:
    planned = gpu_suite.commands(tmp_path, tmp_path / "work", [], "cuda")
    assert [name for name, _ in planned] == list(gpu_suite.RUNS)
    assert planned[0][0] == "profile"  # what the GPU step's speed needs first
    for name, command in planned:
        parsed = _parsed(command)
        assert parsed.device == "cuda" and parsed.shapes == "16x256" and parsed.workdir == tmp_path / "work"
        if command[2] in gpu_suite.OUT_MODULES:
            assert parsed.out == tmp_path
        else:
            assert Path(parsed.json) == tmp_path / f"{name}.json"


def test_only_picks_and_unknown_names_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_suite.main(["--out", str(tmp_path), "--only", "bf16,fp32", "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["fp32", "bf16"]  # the suite's order
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    with pytest.raises(SystemExit):
        gpu_suite.main(["--out", str(tmp_path), "--only", "fp64"])


def test_the_cuda_only_runs_are_left_out_on_the_cpu(tmp_path: Path) -> None:
    on_cpu = [name for name, _ in gpu_suite.commands(tmp_path, tmp_path / "work", [], "cpu")]
    assert on_cpu == [name for name in gpu_suite.RUNS if name not in gpu_suite.CUDA_ONLY] and "own-arenas" not in on_cpu
    assert "unpacked-update" not in on_cpu and "split-unpack" not in on_cpu  # on the CPU the update is not packed
    for _, command in gpu_suite.commands(tmp_path, tmp_path / "work", [], "cpu"):
        _parsed(command)


def test_the_runs_that_change_only_session_options_skip_the_static_figures(tmp_path: Path) -> None:
    planned = dict(gpu_suite.commands(tmp_path, tmp_path / "work", [], "cuda"))
    del planned["profile"], planned["graph-capture"]  # no static figures to skip
    skipping = {name for name, command in planned.items() if arguments().parse_args(command[3:]).no_static}
    assert skipping == {"memory-reuse", "own-arenas", "unpacked-update", "split-unpack"}  # fp32's static figures


def test_no_static_and_static_only_together_are_refused() -> None:
    from benchmarks.real_size.__main__ import main

    with pytest.raises(SystemExit):
        main(["--no-static", "--static-only"])
