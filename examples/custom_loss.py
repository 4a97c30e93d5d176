"""Stack a custom loss on a forward-only ONNX model and evaluate it with onnxruntime.

The base model is a small two-headed network built with blocks; the custom
loss is the weighted average of ONNX Runtime's training documentation, with
only the import changed. Run: ``make demo`` (or ``python examples/custom_loss.py``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

import onnxtrain.onnxblock as onnxblock


class TwoHeadedNet(onnxblock.ForwardBlock):
    """x -> Linear(4, 16) -> Relu -> (Linear(16, 3) class scores, Linear(16, 1) regression)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = onnxblock.blocks.Linear(4, 16)
        self.relu = onnxblock.blocks.Relu()
        self.scores = onnxblock.blocks.Linear(16, 3)
        self.value = onnxblock.blocks.Linear(16, 1)

    def build(self, input_name: str) -> tuple[str, str]:
        features = self.relu(self.hidden(input_name))
        return self.scores(features), self.value(features)


class WeightedAverageLoss(onnxblock.Block):
    """0.4 * cross-entropy(scores, labels) + 0.6 * mse(value, target)."""

    def __init__(self) -> None:
        super().__init__()
        self._loss1 = onnxblock.loss.CrossEntropyLoss(label_smoothing=0.05)
        self._loss2 = onnxblock.loss.MSELoss()
        self._w1 = onnxblock.blocks.Constant(0.4)
        self._w2 = onnxblock.blocks.Constant(0.6)
        self._add = onnxblock.blocks.Add()
        self._mul = onnxblock.blocks.Mul()

    def build(self, scores_name: str, value_name: str) -> str:
        return self._add(
            self._mul(self._w1(), self._loss1(scores_name, labels_name="labels")),
            self._mul(self._w2(), self._loss2(value_name, target_name="target")),
        )


class LossModel(onnxblock.ForwardBlock):
    """The base model's two outputs into the custom loss: one scalar output."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = WeightedAverageLoss()

    def build(self, scores_name: str, value_name: str) -> str:
        return self.loss(scores_name, value_name)


def main() -> None:
    net = TwoHeadedNet()
    with onnxblock.empty_base() as base:
        base.add_input("x", onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch", 4]))
        scores, value = net("x")
    forward = net.to_model_proto()

    loss_model = LossModel()
    with onnxblock.base(forward):
        loss_model(*[output.name for output in forward.graph.output])
    model = loss_model.to_model_proto()

    print(f"forward model: {len(forward.graph.node)} nodes, outputs {[o.name for o in forward.graph.output]}")
    print(f"loss model:    {len(model.graph.node)} nodes, IR version {model.ir_version}, "
          f"inputs {[(i.name, onnx.helper.printable_type(i.type)) for i in model.graph.input]}")

    rng = np.random.default_rng(0)
    batch = 32
    feeds = {
        "x": rng.normal(size=(batch, 4)).astype(np.float32),
        "labels": rng.integers(0, 3, size=batch).astype(np.int64),
        "target": rng.normal(size=(batch, 1)).astype(np.float32),
    }
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (loss,) = session.run(None, feeds)
    print(f"loss on a random batch of {batch}: {float(loss):.6f} (scores {scores!r}, value {value!r})")


if __name__ == "__main__":
    main()
