"""``onnxtrain inspect``: artifact directories (before and after training) and plain models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tests.cli.helpers import assert_error, classification, cli, corrupt


def test_an_untrained_directory(capsys, artifacts: Path):
    status, out, err = cli(capsys, "inspect", artifacts)
    assert (status, err) == (0, "")
    assert "from checkpoint (the initial state, not trained)" in out
    assert "linear.weight_0  [4, 8]" in out and "trainable" in out
    assert "total: 67 elements (67 trainable, 0 frozen)" in out
    assert "x: float32[batch, 4]" in out and "labels: int64[batch]" in out
    assert "(the loss)" in out and "loss: CrossEntropyLoss of" in out
    assert "optimizer: AdamW(" in out
    assert "learning rate: 0.05 (stored by generate)" in out
    assert "training: not started" in out


def test_a_trained_directory(capsys, artifacts: Path, data_path: Path):
    assert cli(capsys, "train", artifacts, "--data", data_path, "--epochs", "2", "--batch-size", "40")[0] == 0
    status, out, _ = cli(capsys, "inspect", artifacts)
    assert status == 0
    assert "from trained_checkpoint (the latest training run)" in out
    assert "training: epoch 2 of 2, step 6; 120 samples, batch size 40, seed 0" in out
    assert "last epoch (2): train loss" in out


def test_a_plain_model(capsys, model_path: Path):
    status, out, err = cli(capsys, "inspect", model_path)
    assert (status, err) == (0, "")
    assert "inputs:\n  x: float32[batch, 4]" in out
    assert "Gemm  2" in out
    lines = out.splitlines()
    first = lines.index("initializers (4):") + 2  # after the header row
    roles = {line.split()[0]: line.split()[-1] for line in lines[first : first + 4]}
    assert set(roles.values()) == {"weight"}, roles  # two Linear blocks' weights and biases
    assert "gradient rules: every differentiable operator has one" in out


def _inspect_graph(capsys, tmp_path: Path, graph: onnx.GraphProto, domain: str) -> tuple[int, str]:
    """``onnxtrain inspect`` on ``graph`` saved as a model importing ai.onnx 17 and ``domain`` 1."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), tmp_path / "m.onnx")
    status, out, _ = cli(capsys, "inspect", tmp_path / "m.onnx")
    return status, out


def test_operators_without_gradient_rules_and_those_that_stop_it(capsys, tmp_path: Path):
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["a"]),
        helper.make_node("Shape", ["a"], ["s"]),
        helper.make_node("Cast", ["s"], ["f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Wobble", ["a"], ["b"], domain="my.ops"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("f", onnx.TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "w")],
    )  # fmt: skip
    status, out = _inspect_graph(capsys, tmp_path, graph, "my.ops")
    assert status == 0
    assert "no gradient rule: my.ops::Wobble" in out
    assert "stop the gradient (not differentiable, by definition): Shape" in out


def test_a_scikit_learn_conversion_without_gradients_names_the_converter_option(capsys, tmp_path: Path):
    """skl2onnx's default LinearRegressor keeps its coefficients in attributes: inspect says how to convert."""
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml", coefficients=[1.0, 2.0])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 1])],
    )  # fmt: skip
    status, out = _inspect_graph(capsys, tmp_path, graph, "ai.onnx.ml")
    assert status == 0
    assert "no gradient rule: ai.onnx.ml::LinearRegressor" in out
    assert "black_op={'LinearRegressor'}" in out


def test_a_model_with_external_data_is_described_without_it(capsys, model_path: Path, tmp_path: Path):
    model = onnx.load(model_path)
    onnx.save(model, tmp_path / "big.onnx", save_as_external_data=True, location="big.data", size_threshold=0)
    (tmp_path / "big.data").unlink()  # the weights are never read
    status, out, _ = cli(capsys, "inspect", tmp_path / "big.onnx")
    assert status == 0 and "total: 67 elements" in out


def test_a_corrupt_model(capsys, tmp_path: Path):
    status, _, err = cli(capsys, "inspect", corrupt(tmp_path / "m.onnx"))
    assert status == 1
    assert_error(err, "inspect", "m.onnx", "not a readable ONNX model")


def test_a_corrupt_checkpoint(capsys, artifacts: Path):
    corrupt(artifacts / "checkpoint")
    status, _, err = cli(capsys, "inspect", artifacts)
    assert status == 1
    assert_error(err, "inspect", "checkpoint")


def test_a_missing_path(capsys, tmp_path: Path):
    status, _, err = cli(capsys, "inspect", tmp_path / "nothing")
    assert status == 1
    assert_error(err, "inspect", "nothing", "does not exist")


def test_a_directory_that_holds_no_artifacts(capsys, tmp_path: Path):
    status, _, err = cli(capsys, "inspect", tmp_path)
    assert status == 1
    assert_error(err, "inspect", "training_model.onnx", "onnxtrain generate")


def test_a_run_with_validation_data_a_schedule_and_early_stopping(
    capsys, artifacts: Path, data_path: Path, tmp_path: Path
):
    x, y = classification(40, seed=1)
    np.savez(tmp_path / "val.npz", X=x, y=y)
    options = ["--epochs", "30", "--batch-size", "16", "--seed", "3", "--val-data", tmp_path / "val.npz",
               "--schedule", "cosine", "--warmup-steps", "4", "--early-stopping", "1"]  # fmt: skip
    assert cli(capsys, "train", artifacts, "--data", data_path, *options)[0] == 0
    status, out, _ = cli(capsys, "inspect", artifacts)
    assert status == 0
    assert "seed 3, validation data from a file, schedule cosine (warmup_steps 4)" in out
    last = next(line for line in out.splitlines() if line.startswith("  last epoch"))
    assert "accuracy" in last and "val accuracy" in last
    assert "stopped early: no lower validation loss for 1 epoch; the best, epoch" in out and "best_checkpoint" in out


def test_a_model_whose_parameters_torchs_exporter_changed(capsys, tmp_path: Path):
    from tests.graph.test_torch_metadata import exported_model

    onnx.save(exported_model(kept=False), tmp_path / "optimized.onnx")
    status, out, _ = cli(capsys, "inspect", tmp_path / "optimized.onnx")
    assert status == 0
    assert (
        "torch's exporter changed parameters for inference in 2 places; export with" in out and "optimize=False" in out
    )
    assert "  merged: net.ln2.weight, net.ln2.bias read as net.ln1.weight, net.ln1.bias" in out
    assert "  folded: net.head.weight, net.head.bias read as val_7" in out
    onnx.save(exported_model(kept=True), tmp_path / "plain.onnx")
    assert "torch's exporter" not in cli(capsys, "inspect", tmp_path / "plain.onnx")[1]


def test_a_model_whose_embedding_follows_torchs_rules(capsys, tmp_path: Path):
    from onnxtrain.artifacts import set_embedding
    from tests.graph.test_embeddings import lookup_model

    model = lookup_model(rows=6)
    onnx.save(model, tmp_path / "plain.onnx")
    assert "embedding lookups" not in cli(capsys, "inspect", tmp_path / "plain.onnx")[1]
    set_embedding(model, "table", padding_idx=3, scale_grad_by_freq=True)
    onnx.save(model, tmp_path / "padded.onnx")
    status, out, _ = cli(capsys, "inspect", tmp_path / "padded.onnx")
    assert status == 0
    heading = "embedding lookups with torch's gradient rules (nn.Embedding's padding_idx, scale_grad_by_freq):"
    assert f"{heading}\n  table: padding row 3, gradient scaled by frequency" in out


def test_an_old_model_shows_its_own_versions_and_the_conversion(capsys, tmp_path: Path):
    """IR 3 at opset 8 (every initializer also a graph input): the file's versions, then the opset training
    converts it to; the inputs are the user's alone."""
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    bias = numpy_helper.from_array(np.ones(4, np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)],
        "old",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape) for name, shape in
         (("x", ["n", 3]), ("W", [4, 3]), ("B", [4]))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])],
        [weight, bias],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)
    onnx.save(model, tmp_path / "old.onnx")
    status, out, _ = cli(capsys, "inspect", tmp_path / "old.onnx")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].endswith("old.onnx: ONNX model, IR version 3, opsets ai.onnx 8")
    assert lines[1] == "  converted to ai.onnx 13 for training by onnx's version converter, as described below"
    assert lines[2:6] == ["inputs:", "  x: float32[n, 3]", "outputs:", "  y: float32[n, 4]"]
