"""ONNX Runtime's training runtime (1.19.2) trains the artifacts onnxtrain wrote; runs in the onnxruntime-training venv.

Usage: ``python ort_runtime_side.py WORK_DIR``. Imports only numpy and
``onnxruntime.capi._pybind_state`` (no torch). ``WORK_DIR/spec.json`` lists
the cases; each case folder holds the artifacts and ``data.npz`` (the user
inputs of every step, ``s<step>_<k>``). For each case it writes into the
folder:

- ``ort_report.json``: the loss of every train step, and the eval loss on
  the last batch after training;
- ``ort_final``: the checkpoint after the last step (parameters only);
- ``ort_inference.onnx``: ``export_model_for_inferencing`` of the eval
  model, where the case asks for it.

A ``nominal`` case loads ``nominal_checkpoint`` and fills it with
``copy_buffer_to_parameters`` from ``buffer.npy`` before training. A
``resume`` case also saves ``ort_half`` (with the optimizer state) half-way,
and trains the second half of the steps from ``onnxtrain_half`` (onnxtrain's
checkpoint of the first half, with its optimizer state) into
``ort_resumed``, adding those losses to the report as ``resumed_losses``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime.capi._pybind_state as C

CPU = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)


def train(folder: Path, state: C.CheckpointState, case: dict, steps: list, half: str | None = None) -> tuple:
    """Train ``steps`` from ``state``; with ``half``, save the checkpoint with its optimizer state there
    after half of them. Returns the losses and the module."""
    options = C.SessionOptions()
    module = C.Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"), CPU, options)
    if case["nominal"]:
        buffer = np.load(folder / "buffer.npy", allow_pickle=False)
        module.copy_buffer_to_parameters(C.OrtValue.ortvalue_from_numpy(buffer, CPU), False)
    optimizer = C.Optimizer(str(folder / "optimizer_model.onnx"), state, CPU, options)
    optimizer.set_learning_rate(case["learning_rate"])
    losses = []
    for step, inputs in enumerate(steps):
        outputs = C.OrtValueVector()
        module.train_step(inputs, outputs)
        losses.append(float(outputs[0].numpy()))
        optimizer.optimizer_step()
        module.lazy_reset_grad()
        if half is not None and step + 1 == len(steps) // 2:
            C.save_checkpoint(state, str(folder / half), True)
    return losses, module


def run_case(folder: Path, case: dict) -> None:
    data = np.load(folder / "data.npz", allow_pickle=False)
    steps = [[data[f"s{t}_{k}"] for k in range(case["num_inputs"])] for t in range(case["steps"])]
    state = C.load_checkpoint(str(folder / ("nominal_checkpoint" if case["nominal"] else "checkpoint")))
    losses, module = train(folder, state, case, steps, "ort_half" if case["resume"] else None)
    outputs = C.OrtValueVector()
    module.eval_step(steps[-1], outputs)
    report = {"losses": losses, "eval_loss": float(outputs[0].numpy())}
    C.save_checkpoint(state, str(folder / "ort_final"), False)
    if case["resume"]:  # resume onnxtrain's checkpoint of half the steps, saved with its optimizer state
        resumed = C.load_checkpoint(str(folder / "onnxtrain_half"))
        report["resumed_losses"], _ = train(folder, resumed, case, steps[len(steps) // 2 :])
        C.save_checkpoint(resumed, str(folder / "ort_resumed"), True)
    if case["export"]:
        module.export_model_for_inferencing(str(folder / "ort_inference.onnx"), case["export"])
    (folder / "ort_report.json").write_text(json.dumps(report))


def main(work: Path) -> None:
    spec = json.loads((work / "spec.json").read_text())
    for case in spec["cases"]:
        run_case(work / case["name"], case)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
