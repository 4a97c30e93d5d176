"""Keeps benchmarks/ from rotting: the onnxtrain and PyTorch workers on the linear regression, a few steps.

Alone (as ``run.run_worker`` runs them) and interleaved (as ``run.run_workload`` does); and on the epoch
workloads, where onnxtrain runs one pass per call (``train_epoch``) and PyTorch its steps.

Timings are never asserted (they are the benchmark's business, docs/benchmarks.md);
the onnxruntime-training environment is never created here.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from benchmarks import report, run
from benchmarks.prepare import BATCHES, Spec
from benchmarks.workers.onnxtrain_worker import session_options
from benchmarks.workloads import WORKLOADS

SETTINGS = run.Settings(warmup=3, repeats=1, steps=2, quick=True, threads=1)


def _linreg_folder(folder: Path) -> Path:
    """The linear-regression workload as benchmarks.prepare writes it, built without torch: ``Gemm(x, W, b)``."""
    workload = WORKLOADS["linreg"]
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((1, 10), dtype=np.float32) * 0.3
    bias = np.array([0.1], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "weight", "bias"], ["output"], transB=1)],
        "linreg",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [workload.batch, 10])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [workload.batch, 1])],
        [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    np.savez(folder / "weights.npz", weight=weight, bias=bias)
    x, y = workload.batches(BATCHES, (workload.batch, 1))
    np.savez(folder / "data.npz", x=x, y=y)
    spec = Spec("linreg", workload.title, "mse", "sgd", 0.01, "input", "output", ["weight", "bias"])
    (folder / "spec.json").write_text(json.dumps(asdict(spec)))
    return folder


def _train(framework: str, folder: Path) -> dict:
    artifacts = folder / f"artifacts-{framework}"
    if framework in run.GENERATES:
        generated = run.run_worker(Path(sys.executable), framework, "generate", folder, artifacts, SETTINGS, 2)
        assert "error" not in generated, generated
        assert (artifacts / "training_model.onnx").exists()
    result = run.run_worker(Path(sys.executable), framework, "train", folder, artifacts, SETTINGS, 2)
    assert "error" not in result, result
    assert result["us_per_step"] > 0 and result["peak_rss_mib"] >= result["rss_after_import_mib"] > 0
    assert len(result["first_losses"]) == 3 and all(math.isfinite(v) for v in result["first_losses"])
    return result


def test_the_onnxtrain_worker_generates_and_trains(tmp_path):
    result = _train(report.ONNXTRAIN, _linreg_folder(tmp_path / "linreg"))
    assert result["first_losses"][2] < result["first_losses"][0] * 10  # trains, does not blow up


def test_pytorch_starts_from_the_same_weights_and_data(tmp_path):
    pytest.importorskip("torch")
    folder = _linreg_folder(tmp_path / "linreg")
    ours, torch_result = _train(report.ONNXTRAIN, folder), _train(report.TORCH, folder)
    np.testing.assert_allclose(ours["first_losses"], torch_result["first_losses"], rtol=1e-5)


def test_run_workload_interleaves_onnxtrain_and_pytorch(tmp_path):
    pytest.importorskip("torch")
    settings = run.Settings(warmup=3, repeats=3, steps=2, quick=True, threads=1, spinning="off")
    frameworks = [report.ONNXTRAIN, report.ORT, report.TORCH]
    pythons: dict[str, Path | str] = dict.fromkeys(frameworks, Path(sys.executable))
    pythons[report.ORT] = "onnxruntime-training unavailable: not in this test"
    results = run.run_workload(WORKLOADS["linreg"], tmp_path, frameworks, pythons, settings)
    assert [(r["framework"], r["workload"]) for r in results] == [(f, "linreg") for f in frameworks]
    ours, ort, torch_result = results
    assert ort["error"] == "onnxruntime-training unavailable: not in this test"
    for result in (ours, torch_result):
        assert "error" not in result, result
        assert len(result["us_per_step_repeats"]) == 3 and result["us_per_step"] in result["us_per_step_repeats"]
        assert len(result["first_losses"]) == 3 and math.isfinite(result["final_loss"])
        assert result["peak_rss_mib"] >= result["rss_after_import_mib"] > 0
    assert "generate_s" in ours and ours["spinning"] == "off"
    np.testing.assert_allclose(ours["first_losses"], torch_result["first_losses"], rtol=1e-5)
    # the counted pass after the repeats: one run per steady step, of the fused step (labelled by its session)
    ((label, runs),) = ours["counted"]["runs_by_label"].items()
    assert label.startswith("fused training step") and runs == 1.0
    assert ours["counted"]["counted_steps"] == 2 and "counted" not in torch_result


def test_quick_mode_prints_the_table(tmp_path, capsys):
    pytest.importorskip("torch")
    argv = ["--quick", "--workloads", "linreg", "--frameworks", "onnxtrain,pytorch", "--steps", "2", "--repeats", "1"]
    assert run.main([*argv, "--workdir", str(tmp_path), "--markdown", str(tmp_path / "report.md")]) == 0
    text = capsys.readouterr().out
    assert text == (tmp_path / "report.md").read_text()
    assert "| linreg | onnxtrain |" in text and "| linreg | pytorch |" in text
    assert "linreg: first-step losses agree" in text
    assert "onnxtrain step time <= 1x onnxruntime-training's: not measured" in text  # ORT not asked for


def test_the_epoch_workloads_run_onnxtrain_by_passes_and_pytorch_by_steps(tmp_path, capsys):
    pytest.importorskip("torch")
    argv = ["--quick", "--workloads", "linreg-epoch,digits-mlp-epoch", "--frameworks", "onnxtrain,pytorch"]
    argv += ["--steps", "2", "--repeats", "1", "--workdir", str(tmp_path), "--json", str(tmp_path / "results.json")]
    assert run.main(argv) == 0
    results = {(r["workload"], r["framework"]): r for r in json.loads((tmp_path / "results.json").read_text())}
    for name, batches in (("linreg-epoch", 200), ("digits-mlp-epoch", 56)):
        ours, torch_result = results[(name, report.ONNXTRAIN)], results[(name, report.TORCH)]
        assert "error" not in ours and "error" not in torch_result, (ours, torch_result)
        assert ours["timed_unit"] == f"train_epoch over {batches} batches of 32" and ours["epochs_per_repeat"] == 1
        # the first three batches of the first pass are PyTorch's first three steps
        np.testing.assert_allclose(ours["first_losses"], torch_result["first_losses"], rtol=1e-5)
        ((label, runs),) = ours["counted"]["runs_by_label"].items()
        assert label.startswith("epoch model") and runs == pytest.approx(1 / batches)
    text = capsys.readouterr().out
    assert "| linreg-epoch | onnxtrain | 1/200 | epoch model" in text
    assert "digits-mlp-epoch: onnxtrain step time <= 0.7x onnxruntime-training's: not measured" in text


def test_spinning_on_or_off_gives_onnxtrain_options_for_all_its_sessions():
    assert session_options(0, "default") is None  # onnxtrain's own: only its fused and epoch steps spin
    for spinning, entry in (("on", "1"), ("off", "0")):
        options = session_options(2, spinning)
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry
        assert options.intra_op_num_threads == 2
