"""The ONNX Runtime side of the interop test; runs in the onnxruntime-training venv.

Usage: ``python ort_side.py WORK_DIR``. Self-contained: imports only numpy,
onnx (1.16) and ``onnxruntime.capi._pybind_state`` (onnxruntime-training
1.19.2, no torch). Reads ``WORK_DIR/spec.json`` and the checkpoints onnxtrain
wrote there, and writes:

- ``loaded_<name>.npz`` and ``report.json``: what ORT loaded from each of our
  checkpoints (parameters, requires_grad, properties, nominal or not);
- ``ort_resaved``: our checkpoint loaded into a Module + AdamW Optimizer and
  saved again by ORT with its optimizer state;
- ``ort_stepped``: the same after one train step (gradients = 1) and one
  optimizer step;
- ``ort_offline`` and ``ort_nominal``: ORT's offline checkpoints
  (``save_checkpoint`` from TensorProtos) of ``offline_params.npz``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime.capi._pybind_state as C
from onnx import TensorProto, helper, numpy_helper

CPU = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)


def training_model(path: Path, params: dict[str, list[int]]) -> None:
    """loss = sum of every parameter's sum; the gradient of each is ones."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in params.items()]
    inputs += [
        helper.make_tensor_value_info(f"{n}_grad.accumulation.buffer", TensorProto.FLOAT, s) for n, s in params.items()
    ]
    inputs.append(helper.make_tensor_value_info("lazy_reset_grad", TensorProto.BOOL, [1]))
    nodes, outputs, sums = [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], []
    for n in params:
        nodes += [
            helper.make_node("ReduceSum", [n], [f"{n}_sum"], keepdims=0),
            helper.make_node("Shape", [n], [f"{n}_shape"]),
            helper.make_node(
                "ConstantOfShape", [f"{n}_shape"], [f"{n}_grad"], value=numpy_helper.from_array(np.ones(1, np.float32))
            ),
            helper.make_node(
                "InPlaceAccumulatorV2",
                [f"{n}_grad.accumulation.buffer", f"{n}_grad", "lazy_reset_grad"],
                [f"{n}_grad.accumulation.out"],
                domain="com.microsoft",
            ),
        ]
        sums.append(f"{n}_sum")
        outputs.append(helper.make_tensor_value_info(f"{n}_grad.accumulation.out", TensorProto.BOOL, [1]))
    nodes.append(helper.make_node("Sum", sums, ["loss"]))
    graph = helper.make_graph(nodes, "train", inputs, outputs)
    save_model(graph, path)


def adamw_model(path: Path, hyper: dict) -> None:
    """ORT's AdamW optimizer model (what onnxblock.optim.AdamW builds)."""
    names = ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"]
    inputs = [
        helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("step", TensorProto.INT64, [1]),
    ] + [helper.make_tensor_sequence_value_info(n, TensorProto.FLOAT, None) for n in names[2:]]
    node = helper.make_node(
        "AdamWOptimizer",
        names,
        ["updated_flag"],
        domain="com.microsoft",
        alpha=hyper["beta1"],
        beta=hyper["beta2"],
        epsilon=hyper["eps"],
        weight_decay=hyper["weight_decay"],
        correct_bias=1,
        adam_mode=1,
    )
    graph = helper.make_graph(
        [node], "optimizer", inputs, [helper.make_tensor_value_info("updated_flag", TensorProto.BOOL, [1])]
    )
    save_model(graph, path)


def save_model(graph: onnx.GraphProto, path: Path) -> None:
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=9), str(path))


def describe(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """What ORT loads from a checkpoint: parameters (or 'nominal') and properties."""
    state = C.load_checkpoint(str(path))
    report: dict = {"params": {}, "properties": {n: state.get_property(n) for n in state.property_names()}}
    arrays = {}
    for name in state.parameter_names():
        try:
            parameter = state.get_parameter(name)
        except RuntimeError as error:
            report["params"][name] = {"error": str(error).strip().splitlines()[-1]}
            continue
        arrays[name] = parameter.data.numpy()
        report["params"][name] = {"requires_grad": bool(parameter.requires_grad)}
    return report, arrays


def main(work: Path) -> None:
    spec = json.loads((work / "spec.json").read_text())
    report: dict = {}
    for name in spec["load"]:
        report[name], arrays = describe(work / name)
        np.savez(work / f"loaded_{name}.npz", **arrays)

    # Module + AdamW optimizer over our checkpoint: ORT reads our optimizer state ...
    training_model(work / "training.onnx", spec["trainable_shapes"])
    adamw_model(work / "optimizer.onnx", spec["adamw"])
    state = C.load_checkpoint(str(work / spec["train"]))
    module = C.Module(str(work / "training.onnx"), state, None, CPU, C.SessionOptions())
    optimizer = C.Optimizer(str(work / "optimizer.onnx"), state, CPU, C.SessionOptions())
    optimizer.set_learning_rate(spec["learning_rate"])
    # ... writes it back unchanged ...
    C.save_checkpoint(state, str(work / "ort_resaved"), True)
    # ... and takes one step with it.
    outputs = C.OrtValueVector()
    module.train_step([np.ones(1, np.float32)], outputs)
    optimizer.optimizer_step()
    C.save_checkpoint(state, str(work / "ort_stepped"), True)

    # ORT's offline checkpoints, from TensorProtos.
    offline = np.load(work / "offline_params.npz", allow_pickle=False)
    tensors = {n: numpy_helper.from_array(offline[n], n).SerializeToString() for n in offline.files}
    trainable = [tensors[n] for n in spec["offline_trainable"]]
    frozen = [tensors[n] for n in offline.files if n not in spec["offline_trainable"]]
    C.save_checkpoint(trainable, frozen, str(work / "ort_offline"), False)
    C.save_checkpoint(trainable, frozen, str(work / "ort_nominal"), True)

    (work / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
