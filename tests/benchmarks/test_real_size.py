"""Keeps ``python -m benchmarks.real_size`` from rotting: its whole path on a GPT-2 of 2 layers and 32 features.

The real sizes are the benchmark's business (docs/benchmarks.md, "Real-size
models"); here the tiny model is exported, its artifacts written, onnxtrain and
PyTorch (SDPA) each train a few steps in a process of their own, and the
tables come out. Timings are never asserted.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from benchmarks.real_size import memory, report, static
from benchmarks.real_size.__main__ import main

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_tiny_gpt2_trains_in_both_frameworks_and_the_tables_come_out(tmp_path: Path, capsys):
    argv = ["--workload", "gpt2-tiny", "--shapes", "2x8", "--frameworks", "onnxtrain,pytorch-sdpa", "--runs", "1"]
    argv += ["--warmup", "2", "--steps", "1", "--workdir", str(tmp_path), "--json", str(tmp_path / "out.json")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    raw = json.loads((tmp_path / "out.json").read_text())
    ours, theirs = raw["results"]
    assert (ours["framework"], theirs["framework"]) == ("onnxtrain", "pytorch-sdpa")
    # the same weights and batches: the same first losses (before any update) and the same AdamW steps
    np.testing.assert_allclose(ours["losses"], theirs["losses"], rtol=1e-4)
    assert ours["state"]["moments"]["tensors"] == 2 * ours["state"]["parameters"]["tensors"]
    assert ours["state"]["parameters"]["copies"] == 1.0 and theirs["state"]["saved_for_backward"]["mib"] > 0
    assert report.peak_above_baseline(ours) > 0
    figures = raw["static"]["gpt2-tiny"]["2x8"]
    assert set(figures) == {"fused", "reset", "fused, optimized", "reset, optimized"}
    # operations launched per step: onnxtrain's nodes that compute, as run here and as a GPU would run them (the
    # update packed: fewer), and PyTorch's ATen operations with a multi-tensor AdamW, as on CUDA
    kernels = raw["kernels"]["gpt2-tiny"]
    here, on_gpu = kernels["launches"], kernels["as on a GPU"]["launches"]
    assert 0 < on_gpu["launches"] < here["launches"] == kernels["nodes"] - here["aliases"]
    assert theirs["launches"]["launches"] > 0 and theirs["launches"]["foreach"] > 0
    # and the bytes they move at the first batch shape, every size known
    assert kernels["shape"] == "2x8" and here["unsized"] == on_gpu["unsized"] == 0
    assert here["bytes"] > 0 and on_gpu["bytes"] > 0 and theirs["launches"]["bytes"] > 0
    assert "Operations launched on a device per step" in text
    assert figures["fused"]["held_mib"]["moments"] == 2 * figures["fused"]["held_mib"]["parameters"]
    assert raw["kernels"]["gpt2-tiny"]["nodes"] < raw["kernels"]["gpt2-tiny"]["emitted"]
    for table in ("Speed and peak memory:", "Memory breakdown:", "Static figures of the training graphs:"):
        assert table in text
    assert "| gpt2-tiny | 2x8 | onnxtrain |" in text and "| gpt2-tiny | 2x8 | fused (priority) |" in text
    # the sizes the analysis could not know are counted: the label checks' outputs, nothing of the model
    assert all(len(f["unknown"]) <= 2 for f in figures.values())
    assert text.count("| sizes unknown |") == 1
    # off the CPU the runtime runs the fused step with the batch's shapes folded, whatever its size
    artifacts = tmp_path / "gpt2-tiny" / "artifacts"
    assert not static.folds_every_shape(["CPUExecutionProvider"])
    on_gpu = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert static.folds_every_shape(on_gpu) and static.folds_every_shape(["DmlExecutionProvider"])
    general, folded = static.fused_model(artifacts), static.fused_as_run(artifacts, (2, 8), on_gpu)
    assert static.fused_as_run(artifacts, (2, 8)) == general
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in folded.graph.input}
    ids, labels = static.user_inputs(onnx.load(str(artifacts / "training_model.onnx"), load_external_data=False))
    assert dims[ids] == [2, 8] and dims[labels] == [16]
    # and AdamW's per-parameter chains run once, on the parameters packed inside the step: 4 Concats
    assert [n.op_type for n in folded.graph.node].count("Concat") >= 4 + [n.op_type for n in general.graph.node].count(
        "Concat"
    )
    assert static.ort_kernels(folded)["nodes"] < static.ort_kernels(general)["nodes"]
    with warnings.catch_warnings():  # no CUDA here: onnxruntime optimizes for the CPU; the folding is the point
        warnings.simplefilter("ignore")
        as_on_gpu = static.static_figures(artifacts, [(2, 8)], on_gpu)["2x8"]
    assert as_on_gpu["fused, optimized"]["nodes"] < figures["fused, optimized"]["nodes"]
    assert as_on_gpu["reset, optimized"]["nodes"] == figures["reset, optimized"]["nodes"]  # the first step: as built


def test_autograd_s_saved_tensors_are_counted_once_without_the_parameters():
    torch = pytest.importorskip("torch")
    weight = torch.nn.Parameter(torch.ones(4, 3))
    module = torch.nn.Module()
    module.weight = weight
    x = torch.ones(4, 3)
    # MulBackward keeps x (48 bytes) for the weight's gradient, and not the weight, whose gradient is not asked
    saved = memory.torch_saved(module, lambda: (weight * x).sum())
    assert saved["mib"] * memory.MIB == 48 and saved["groups"] == [
        {"kind": "4x3 float32", "count": 1, "mib": 48 / memory.MIB}
    ]
    assert memory.torch_saved(module, lambda: (weight * 3).sum())["mib"] == 0


def test_no_nvml_means_no_gpu_figures():
    figures = memory.gpu_used_mib()
    assert figures is None or "device_mib" in figures


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_tiny_gpt2_trains_in_a_half_precision_in_both_frameworks(tmp_path: Path, capsys, precision: str):
    argv = ["--workload", "gpt2-tiny", "--shapes", "2x8", "--frameworks", "onnxtrain,pytorch-eager", "--runs", "1"]
    argv += ["--warmup", "2", "--steps", "1", "--workdir", str(tmp_path), "--json", str(tmp_path / "out.json")]
    assert main([*argv, "--precision", precision]) == 0
    raw = json.loads((tmp_path / "out.json").read_text())
    ours, theirs = raw["results"]
    assert ours["precision"] == theirs["precision"] == precision
    assert (tmp_path / "gpt2-tiny" / f"artifacts-{precision}" / "checkpoint").exists()
    # the same weights and batches, each framework rounding in the half type its own way: the losses agree to it
    np.testing.assert_allclose(ours["losses"], theirs["losses"], rtol=3e-2)
    assert f"Precision {precision}" in capsys.readouterr().out
