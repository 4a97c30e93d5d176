"""The report's ratios and verdicts, on made-up results (no timing is measured here)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import report


def _result(framework: str, repeats: list[float], workload: str = "mlp", **extra: Any) -> dict[str, Any]:
    ordered = sorted(repeats)
    return {
        "framework": framework,
        "workload": workload,
        "us_per_step": ordered[len(ordered) // 2],
        "us_per_step_min": ordered[0],
        "us_per_step_repeats": repeats,
        "steps_per_s": 1e6 / ordered[len(ordered) // 2],
        "peak_rss_mib": 100.0,
        "rss_after_import_mib": 60.0,
        **extra,
    }


def test_the_paired_ratio_divides_out_a_slow_spell_that_the_ratio_of_the_medians_keeps():
    # onnxtrain takes 0.9x of the peer's time in each turn; the machine slows down twice in turn 3, between
    # onnxtrain's repeat and the peer's: the medians come from different speeds of the machine
    ours = [900.0, 900.0, 900.0, 1800.0, 1800.0]
    theirs = [1000.0, 1000.0, 2000.0, 2000.0, 2000.0]
    results = [_result(report.ONNXTRAIN, ours), _result(report.ORT, theirs)]
    assert report.ratio(results, "mlp", "time", report.ORT) == pytest.approx(900 / 2000)
    assert report.paired_ratio(results, "mlp", report.ORT) == pytest.approx(0.9)


def test_time_targets_are_judged_on_the_paired_ratio_and_show_both():
    workloads = [("mlp", "MLP")]
    results = [_result(report.ONNXTRAIN, [1000.0, 1200.0, 1100.0]), _result(report.ORT, [1050.0, 1100.0, 1000.0])]
    lines = report.target_lines(results, workloads)
    mlp_ort = next(line for line in lines if "step time <= 1x onnxruntime-training" in line)
    # per turn 0.952, 1.091, 1.1: median 1.09; medians 1100 / 1050 = 1.05
    assert mlp_ort.endswith("1.09x paired (ratio of the medians 1.05x): **NOT met**")
    table = report.ratio_table(results, workloads)
    assert "| mlp | 1.05x (paired 1.09x) | n/a |" in table
    memory = next(line for line in lines if "peak memory <= 1.2x onnxruntime-training" in line)
    assert memory.endswith("1.00x: met")  # not a time: no pairs


def test_without_repeats_or_without_the_peer_there_is_no_paired_ratio():
    ours = _result(report.ONNXTRAIN, [1000.0])
    assert report.paired_ratio([ours], "mlp", report.ORT) is None
    theirs = _result(report.ORT, [1000.0])
    del theirs["us_per_step_repeats"]
    assert report.paired_ratio([ours, theirs], "mlp", report.ORT) is None
    failed = {"framework": report.ORT, "workload": "mlp", "error": "could not generate"}
    assert report.paired_ratio([ours, failed], "mlp", report.ORT) is None


def test_the_steady_step_targets_are_listed_apart_from_the_issue_and_cover_the_epoch_workloads():
    workloads = [("linreg-epoch", "pass"), ("mlp", "MLP")]
    results = [
        _result(report.ONNXTRAIN, [300.0, 310.0, 290.0], workload="linreg-epoch"),
        _result(report.ORT, [1000.0, 1000.0, 1000.0], workload="linreg-epoch"),
    ]
    text = "\n".join(report.target_sections(results, workloads))
    issue, steady = text.split(f"Targets ({report.STEADY}):")
    assert issue.startswith(f"Targets ({report.ISSUE}):")
    assert "mlp: onnxtrain step time <= 1x onnxruntime-training's: not measured" in issue
    assert "linreg-epoch: onnxtrain step time <= 0.33x onnxruntime-training's: 0.30x paired" in steady
    assert steady.count("\n- ") == 2  # linreg-epoch's and mlp's; linreg and digits-mlp-epoch did not run


def test_the_runs_table_shows_the_counted_pass_of_those_that_have_one():
    counted = {
        "runs_per_step": 1 / 56,
        "runs_by_label": {"epoch model": 1 / 56},
        "us_inside_runs_per_step": 40.0,
        "us_outside_runs_per_step": 1.5,
        "us_counted_step": 41.6,
    }
    ort = {"runs_per_step": 2.0, "runs_by_label": {"Module.train_step": 1.0, "Optimizer.optimizer_step": 1.0}}
    ort.update(us_inside_runs_per_step=80.0, us_outside_runs_per_step=6.0, us_counted_step=86.5)
    ort["us_inside_by_label"] = {"Module.train_step": 55.0, "Optimizer.optimizer_step": 25.0}
    results = [
        _result(report.ONNXTRAIN, [41.0], workload="digits-mlp-epoch", counted=counted),
        _result(report.ORT, [86.0], workload="digits-mlp-epoch", counted=ort),
        _result(report.TORCH, [400.0], workload="digits-mlp-epoch"),
    ]
    table = report.runs_table(results, [("digits-mlp-epoch", "digits")])
    rows = table.splitlines()[2:]
    assert rows == [
        "| digits-mlp-epoch | onnxtrain | 1/56 | epoch model 1/56 | 40 | 1.5 | 41.6 µs |",
        "| digits-mlp-epoch | onnxruntime-training | 2 | Module.train_step 1 (55 µs), Optimizer.optimizer_step 1 "
        "(25 µs) | 80 | 6 | 86.5 µs |",
    ]
    assert report.runs_table(results[2:], [("digits-mlp-epoch", "digits")]) == ""
