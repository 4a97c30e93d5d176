"""``onnxtrain generate``: artifacts from a model, the options mapped onto the library, one-line errors."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain import checkpoint
from onnxtrain.artifacts import TARGETS
from onnxtrain.artifacts.generate import OPTIMIZER_KEY
from onnxtrain.artifacts.metadata import LOSS_KEY, MODEL_OUTPUTS_KEY, PRECISION_KEY, read_metadata
from onnxtrain.cli import generate
from onnxtrain.graph.passes.recompute import recomputes
from onnxtrain.loop import LEARNING_RATE_PROPERTY
from onnxtrain.training.half_kernels import HalfPrecisionFallbackWarning
from tests.cli.docs import python_example
from tests.cli.helpers import assert_error, cli, corrupt
from tests.folders import visible_names

ARTIFACTS = {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"}


def _generate(capsys: pytest.CaptureFixture[str], model: Path, out: Path, *options: str) -> tuple[int, str, str]:
    return cli(capsys, "generate", model, "--requires-grad", "all-float", "--loss", "ce", "-o", out, *options)


def test_writes_the_artifacts_and_lists_them(capsys, model_path: Path, tmp_path: Path):
    status, out, err = _generate(capsys, model_path, tmp_path / "art")
    assert (status, err) == (0, "")
    assert set(visible_names(tmp_path / "art")) == ARTIFACTS
    assert str((tmp_path / "art").resolve()) in out
    assert all(name in out for name in ARTIFACTS)
    training = onnx.load(tmp_path / "art" / "training_model.onnx")
    assert read_metadata(training)[LOSS_KEY] == "CrossEntropyLoss"
    outputs = [o.name for o in onnx.load(model_path).graph.output]
    assert json.loads(read_metadata(training)[MODEL_OUTPUTS_KEY]) == outputs
    assert LEARNING_RATE_PROPERTY not in checkpoint.load(tmp_path / "art" / "checkpoint").properties


def test_all_float_selects_every_float_initializer(capsys, model_path: Path, tmp_path: Path):
    floats = [t.name for t in onnx.load(model_path).graph.initializer]
    assert _generate(capsys, model_path, tmp_path / "art")[0] == 0
    state = checkpoint.load(tmp_path / "art" / "checkpoint")
    assert sorted(state.trainable) == sorted(floats) and not state.frozen


def test_frozen_parameters_stay_out_of_all_float(capsys, model_path: Path, tmp_path: Path):
    first = onnx.load(model_path).graph.initializer[0].name
    assert _generate(capsys, model_path, tmp_path / "art", "--frozen", first)[0] == 0
    state = checkpoint.load(tmp_path / "art" / "checkpoint")
    assert list(state.frozen) == [first] and first not in state.trainable


def test_the_learning_rate_is_stored_in_the_checkpoint(capsys, model_path: Path, tmp_path: Path):
    assert _generate(capsys, model_path, tmp_path / "art", "--lr", "0.25")[0] == 0
    properties = checkpoint.load(tmp_path / "art" / "checkpoint").properties
    assert properties[LEARNING_RATE_PROPERTY] == pytest.approx(0.25)


def test_optimizer_options_build_the_library_optimizer(capsys, model_path: Path, tmp_path: Path):
    options = ["--optimizer", "sgd", "--momentum", "0.9", "--weight-decay", "0.01", "--max-grad-norm", "1.5"]
    assert _generate(capsys, model_path, tmp_path / "art", *options)[0] == 0
    description = read_metadata(onnx.load(tmp_path / "art" / "optimizer_model.onnx"))[OPTIMIZER_KEY]
    assert description.startswith("SGD(momentum=0.9,") and "weight_decay=0.01" in description
    assert "ClipGradNorm(max_norm=1.5)" in description


@pytest.mark.parametrize(
    ("options", "written"),
    [
        (["--max-grad-norm", "1.5", "--grad-norm-type", "inf"], "ClipGradNorm(max_norm=1.5, norm_type=inf)"),
        (["--max-grad-norm", "2", "--grad-norm-type", "1"], "ClipGradNorm(max_norm=2.0, norm_type=1.0)"),
        (["--clip-grad-value", "0.5"], "ClipGradValue(clip_value=0.5)"),
    ],
)
def test_clipping_options(capsys, model_path: Path, tmp_path: Path, options: list[str], written: str):
    assert _generate(capsys, model_path, tmp_path / "art", *options)[0] == 0
    assert written in read_metadata(onnx.load(tmp_path / "art" / "optimizer_model.onnx"))[OPTIMIZER_KEY]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--grad-norm-type", "1"], "give --max-grad-norm too"),
        (["--max-grad-norm", "1", "--clip-grad-value", "1"], "not allowed with argument"),
        (["--max-grad-norm", "1", "--grad-norm-type", "0"], "0 is not a number > 0 (or inf"),
        (["--max-grad-norm", "0"], "0 is not a finite number > 0"),
        (["--max-grad-norm", "1", "--grad-norm-type", "nan"], "nan is not a number > 0"),
        (["--clip-grad-value", "0.5", "--target", "onnxruntime-training"], "L2 norm only"),
    ],
)
def test_clipping_options_that_do_not_fit(capsys, model_path: Path, tmp_path: Path, options: list[str], said: str):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", *options)
    assert status != 0 and said in err
    assert not (tmp_path / "art").exists()


def test_no_decay_leaves_the_parameters_it_names_out_of_weight_decay(capsys, model_path: Path, tmp_path: Path):
    options = ["--weight-decay", "0.1", "--no-decay", "bias"]
    assert _generate(capsys, model_path, tmp_path / "art", *options)[0] == 0
    description = read_metadata(onnx.load(tmp_path / "art" / "optimizer_model.onnx"))[OPTIMIZER_KEY]
    assert "no_decay=['bias']" in description
    status, _, err = _generate(capsys, model_path, tmp_path / "other", "--no-decay", "bias")
    assert status != 0 and "give --weight-decay too" in err


def test_lr_scale_steps_the_parameters_it_names_at_a_scaled_rate(capsys, model_path: Path, tmp_path: Path):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", "--lr-scale", "*bias*=10", "*weight*=0.5")
    assert (status, err) == (0, "")
    description = read_metadata(onnx.load(tmp_path / "art" / "optimizer_model.onnx"))[OPTIMIZER_KEY]
    assert "lr_scale={'*bias*': 10.0, '*weight*': 0.5}" in description
    status, _, err = _generate(capsys, model_path, tmp_path / "other", "--lr-scale", "classifier")
    assert status != 0 and "'classifier' is not PATTERN=FACTOR" in err


def _two_outputs(path: Path) -> Path:
    """``a = x @ w`` [batch, 2] and ``b = x @ v`` [batch, 1]: a model of two heads."""
    from onnx import TensorProto, helper

    from tests.helpers import make_model

    rng = np.random.default_rng(0)
    model = make_model(
        {"x": (TensorProto.FLOAT, ["batch", 3])},
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["x", "v"], ["b"])],
        {"a": (TensorProto.FLOAT, ["batch", 2]), "b": (TensorProto.FLOAT, ["batch", 1])},
        [("w", rng.normal(size=(3, 2)).astype(np.float32)), ("v", rng.normal(size=(3, 1)).astype(np.float32))],
    )
    onnx.save(model, path)
    return path


def test_a_model_of_two_outputs_names_the_one_a_loss_trains(capsys, tmp_path: Path):
    """With the library's default (every output to the loss), mse of ('a', 'b') pulled a toward b, with no
    labels: the command asks which output to train."""
    model = _two_outputs(tmp_path / "two.onnx")
    status, _, err = cli(capsys, "generate", model, "--requires-grad", "weights", "--loss", "mse", "-o", tmp_path / "x")
    assert status == 2
    assert_error(err, "generate", "2 outputs ('a', 'b')", "--loss mse reads one output and its target",
                 "--loss-inputs a")  # fmt: skip
    assert not (tmp_path / "x").exists()
    status, _, err = cli(capsys, "generate", model, "--requires-grad", "weights", "--loss", "mse",
                         "--loss-inputs", "b", "-o", tmp_path / "art")  # fmt: skip
    assert (status, err) == (0, "")
    inputs = [v.name for v in onnx.load(tmp_path / "art" / "training_model.onnx").graph.input]
    assert "target" in inputs


def test_generate_over_a_training_run_refuses_unless_told_to_discard_it(capsys, model_path: Path, artifacts: Path,
                                                                        data_path: Path):  # fmt: skip
    """New artifacts over a trained run left its checkpoint belonging to other models: resume, inspect and export
    failed or mixed the two."""
    status, _, err = cli(capsys, "train", artifacts, "--data", data_path, "--epochs", "1", "--batch-size", "16")
    assert (status, err) == (0, "")
    trained = (artifacts / "trained_checkpoint").read_bytes()
    before = {name: (artifacts / name).read_bytes() for name in ARTIFACTS}
    status, _, err = _generate(capsys, model_path, artifacts, "--optimizer", "sgd")
    assert status == 2
    assert_error(err, "generate", "holds a training run (trained_checkpoint)", "another folder", "--discard-run")
    assert {name: (artifacts / name).read_bytes() for name in ARTIFACTS} == before
    assert (artifacts / "trained_checkpoint").read_bytes() == trained
    status, out, err = _generate(capsys, model_path, artifacts, "--optimizer", "sgd", "--discard-run")
    assert (status, err) == (0, "") and "removed trained_checkpoint" in out
    assert set(visible_names(artifacts)) == ARTIFACTS
    status, _, err = cli(capsys, "train", artifacts, "--data", data_path, "--epochs", "1", "--batch-size", "16")
    assert (status, err) == (0, "")


def test_an_option_given_twice_takes_both_lists(capsys, model_path: Path, tmp_path: Path):
    """argparse keeps the last of an option given twice; --requires-grad a --requires-grad b froze a silently."""
    first, second = (t.name for t in onnx.load(model_path).graph.initializer[:2])
    status, _, err = cli(capsys, "generate", model_path, "--requires-grad", first, "--loss", "ce",
                         "--requires-grad", second, "--lr-scale", f"{first}=10", "--lr-scale", f"{second}=0.5",
                         "-o", tmp_path / "art")  # fmt: skip
    assert (status, err) == (0, "")
    assert sorted(checkpoint.load(tmp_path / "art" / "checkpoint").trainable) == sorted([first, second])
    description = read_metadata(onnx.load(tmp_path / "art" / "optimizer_model.onnx"))[OPTIMIZER_KEY]
    assert f"lr_scale={{'{first}': 10.0, '{second}': 0.5}}" in description


@pytest.mark.parametrize("loss", [name for name, kind in generate.LOSSES.items() if kind in ("MSELoss", "L1Loss")])
def test_regression_losses_take_a_float_target(capsys, model_path: Path, tmp_path: Path, loss: str):
    status, _, err = cli(capsys, "generate", model_path, "--requires-grad", "all-float", "--loss", loss, "-o", tmp_path)
    assert (status, err) == (0, "")


def test_the_prefix_and_the_loss_inputs(capsys, model_path: Path, tmp_path: Path):
    output = onnx.load(model_path).graph.output[0].name
    status, _, _ = _generate(capsys, model_path, tmp_path, "--prefix", "p_", "--loss-inputs", output)
    assert status == 0 and (tmp_path / "p_training_model.onnx").is_file()


def test_the_targets_are_the_librarys():
    assert generate.TARGETS == TARGETS


def test_the_onnxruntime_training_target_writes_onnx_runtimes_kernels(capsys, model_path: Path, tmp_path: Path):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", "--target", "onnxruntime-training")
    assert (status, err) == (0, "")
    training = onnx.load(tmp_path / "art" / "training_model.onnx")
    assert {n.op_type for n in training.graph.node if n.domain == "com.microsoft"} == {"InPlaceAccumulatorV2"}


def test_an_optimizer_onnx_runtime_lacks_is_one_error_line(capsys, model_path: Path, tmp_path: Path):
    status, out, err = _generate(
        capsys, model_path, tmp_path / "art", "--target", "onnxruntime-training", "--optimizer", "sgd",
        "--momentum", "0.9",
    )  # fmt: skip
    assert status == 1 and out == ""
    assert_error(err, "generate", "SGD(momentum=0.9", "AdamW (without amsgrad)")
    assert not (tmp_path / "art").exists()


def test_an_unknown_loss_is_a_usage_error(capsys, model_path: Path, tmp_path: Path):
    status, _, err = cli(capsys, "generate", model_path, "--requires-grad", "a", "--loss", "hinge", "-o", tmp_path)
    assert status == 2
    assert_error(err, "generate", "--loss", "'hinge'")


def test_momentum_for_adam_is_a_usage_error(capsys, model_path: Path, tmp_path: Path):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", "--optimizer", "adam", "--momentum", "0.9")
    assert status == 2
    assert_error(err, "generate", "--momentum", "adam")


@pytest.mark.parametrize("option", [["--lr", "-1"], ["--weight-decay", "nan"], ["--max-grad-norm", "0"]])
def test_bad_numbers_are_usage_errors(capsys, model_path: Path, tmp_path: Path, option: list[str]):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", *option)
    assert status == 2
    assert_error(err, "generate", option[0])


def test_a_missing_model(capsys, tmp_path: Path):
    status, _, err = _generate(capsys, tmp_path / "nowhere.onnx", tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", "nowhere.onnx")


def test_a_corrupt_model(capsys, tmp_path: Path):
    model = corrupt(tmp_path / "random.onnx")
    status, _, err = _generate(capsys, model, tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", "random.onnx", "not a readable ONNX model")


def test_an_unknown_parameter_name(capsys, model_path: Path, tmp_path: Path):
    status, _, err = cli(capsys, "generate", model_path, "--requires-grad", "w9", "--loss", "ce", "-o", tmp_path / "a")
    assert status == 1
    assert_error(err, "generate", "w9")


def test_a_model_without_float_initializers(capsys, tmp_path: Path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 2])],
        [onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "shape")],
    )  # fmt: skip
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    status, _, err = _generate(capsys, tmp_path / "m.onnx", tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", "has no weights to train", "onnxtrain inspect")


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        (["--requires-grad", "w9"], ["--requires-grad names 'w9'"]),
        (["--requires-grad", "all-float", "--frozen", "nope"], ["--frozen names 'nope'"]),
        (["--requires-grad", "all-float", "--loss-inputs", "nope"], ["--loss-inputs names ['nope']"]),
        (["--requires-grad", "linear.weight_0", "--frozen", "linear.weight_0"], ["--requires-grad and --frozen"]),
        (["--requires-grad", "all-float", "--activation-checkpoints", "nope"], ["--activation-checkpoints names"]),
    ],
)
def test_errors_name_the_options_not_the_librarys_arguments(
    capsys, model_path: Path, tmp_path: Path, options: list[str], fragments: list[str]
):
    status, _, err = cli(capsys, "generate", model_path, *options, "--loss", "ce", "-o", tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", *fragments)
    assert not any(name in err for name in ("requires_grad", "frozen_params", "loss_input_names", "ModelProto"))


@pytest.mark.parametrize("values", [[], ["layer_2"]])
def test_activation_checkpoints_recompute_in_the_backward(capsys, tmp_path: Path, values: list[str]):
    path = tmp_path / "mlp.onnx"
    onnx.save(_two_layers(), path)
    status, _, err = _generate(capsys, path, tmp_path / "art", "--activation-checkpoints", *values)
    assert (status, err) == (0, "")
    training = onnx.load(tmp_path / "art" / "training_model.onnx")
    copies = [node.op_type for node in training.graph.node if node.name.endswith(".recomputed")]
    assert "Relu" in copies and recomputes(training)


def _two_layers() -> onnx.ModelProto:
    """``Gemm -> Relu -> Gemm -> Relu -> Gemm`` on ``[batch, 4]``: ``layer_1`` and ``layer_2`` are the Relus'
    outputs."""
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=shape).astype(np.float32) for shape in ((4, 8), (8, 8), (8, 3))]
    nodes = [
        onnx.helper.make_node("Gemm", ["x", "w0"], ["h0"]),
        onnx.helper.make_node("Relu", ["h0"], ["layer_1"]),
        onnx.helper.make_node("Gemm", ["layer_1", "w1"], ["h1"]),
        onnx.helper.make_node("Relu", ["h1"], ["layer_2"]),
        onnx.helper.make_node("Gemm", ["layer_2", "w2"], ["scores"]),
    ]
    graph = onnx.helper.make_graph(
        nodes, "mlp", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [onnx.helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, ["batch", 3])],
        [onnx.numpy_helper.from_array(w, f"w{k}") for k, w in enumerate(weights)],
    )  # fmt: skip
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_a_missing_model_is_named_in_the_commands_words(capsys, tmp_path: Path):
    status, _, err = _generate(capsys, tmp_path / "nowhere.onnx", tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", "nowhere.onnx", ".onnx file")
    assert "ModelProto" not in err


@pytest.fixture
def loss_file(tmp_path: Path) -> Path:
    """The custom loss of docs/cli.md, as written there, in ``tmp_path / "losses" / "mse_plus_l1.py"``
    (tests/cli/test_docs.py runs its documented command)."""
    (tmp_path / "losses").mkdir()
    path = tmp_path / "losses" / "mse_plus_l1.py"
    path.write_text(python_example("# mse_plus_l1.py"))
    return path


def test_a_custom_loss_from_a_module(capsys, monkeypatch, model_path: Path, loss_file: Path, tmp_path: Path):
    monkeypatch.syspath_prepend(str(loss_file.parent))
    monkeypatch.delitem(sys.modules, "mse_plus_l1", raising=False)
    status, _, err = _custom(capsys, model_path, tmp_path, "mse_plus_l1:MSEPlusL1")
    assert (status, err) == (0, "")
    assert read_metadata(onnx.load(tmp_path / "art" / "eval_model.onnx"))[LOSS_KEY] == "MSEPlusL1"


def _custom(capsys, model_path: Path, tmp_path: Path, loss: str) -> tuple[int, str, str]:
    return cli(capsys, "generate", model_path, "--requires-grad", "all-float", "--loss", loss, "-o", tmp_path / "art")


@pytest.mark.parametrize(
    ("loss", "status", "fragments"),
    [
        ("{file}:Nothing", 1, ["has no 'Nothing'", "['MSEPlusL1']"]),
        ("{file}:onnxblock", 1, ["onnxblock is a module, not a Block class"]),
        ("{folder}/missing.py:MSEPlusL1", 1, ["no Python file", "missing.py"]),
        ("no_such_module_here:Loss", 1, ["no module 'no_such_module_here'", "path/to/no_such_module_here.py:Loss"]),
        ("{folder}/needs_arguments.py:Weighted", 1, ["Weighted() needs weight", "without arguments"]),
        ("hinge", 2, ["--loss", "'hinge'", "module:Class"]),
    ],
)
def test_custom_loss_errors(
    capsys, model_path: Path, loss_file: Path, tmp_path: Path, loss: str, status: int, fragments: list[str]
):
    (loss_file.parent / "needs_arguments.py").write_text(
        "import onnxtrain.onnxblock as onnxblock\n\n\nclass Weighted(onnxblock.Block):\n"
        "    def __init__(self, weight):\n        super().__init__()\n"
    )
    spec = loss.format(file=loss_file, folder=loss_file.parent)
    result, out, err = _custom(capsys, model_path, tmp_path, spec)
    assert result == status and out == ""
    assert_error(err, "generate", *fragments)
    assert not (tmp_path / "art").exists()


def test_weights_selects_the_weights_and_leaves_constants_and_statistics(capsys, tmp_path: Path):
    """``--requires-grad weights`` (and its older name all-float) trains what inspect lists as weights; a
    BatchNorm's running statistics become parameters updated in training mode, never trained."""
    from tests.graph.test_roles import _graph_of_every_use

    model = _graph_of_every_use()
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            node.attribute.append(onnx.helper.make_attribute("training_mode", 1))
            node.output.extend(["bn_mean_out", "bn_var_out"])
    onnx.save(model, tmp_path / "m.onnx")
    status, out, _ = cli(capsys, "inspect", tmp_path / "m.onnx")
    assert status == 0
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("  bn.running_")] == ["statistic"] * 2
    for option in ("weights", "all-float"):
        argv = ["generate", tmp_path / "m.onnx", "--requires-grad", option, "--loss", "mse", "-o", tmp_path / option]
        status, out, err = cli(capsys, *argv)
        assert (status, err) == (0, ""), err
        assert "6 trainable, 0 frozen, 2 running statistics (updated in training mode)" in out
        state = checkpoint.load(tmp_path / option / "checkpoint")
        assert sorted(state.trainable) == sorted(
            ["linear.weight", "linear.bias", "head.bias", "bn.weight", "bn.bias", "table"]
        )
        assert sorted(state.frozen) == ["bn.running_mean", "bn.running_var"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_precision_writes_artifacts_that_compute_in_half_and_train(
    capsys, model_path: Path, data_path: Path, tmp_path: Path, precision: str
):
    options = ("--precision", precision, "--precision-override", "Relu=half")
    assert _generate(capsys, model_path, tmp_path / "art", *options)[0] == 0
    training = onnx.load(tmp_path / "art" / "training_model.onnx")
    assert read_metadata(training)[PRECISION_KEY] == precision
    half = {"bf16": onnx.TensorProto.BFLOAT16, "fp16": onnx.TensorProto.FLOAT16}[precision]
    casts = [n for n in training.graph.node if n.op_type == "Cast" and n.attribute[0].i == half]
    assert casts  # the matrix products read half copies of their inputs
    state = checkpoint.load(tmp_path / "art" / "checkpoint")
    assert {np.asarray(v).dtype for v in state.trainable.values()} == {np.dtype(np.float32)}  # master weights
    with warnings.catch_warnings():  # a provider without some half kernel runs those operators in float32
        warnings.simplefilter("ignore", HalfPrecisionFallbackWarning)
        status, _, err = cli(
            capsys, "train", tmp_path / "art", "--data", data_path, "--epochs", "2", "--batch-size", "16"
        )
    assert status == 0, err


def test_a_bad_precision_override_is_a_usage_error(capsys, model_path: Path, tmp_path: Path):
    status, _, err = _generate(
        capsys, model_path, tmp_path / "art", "--precision", "bf16", "--precision-override", "MatMul=int8"
    )
    assert status == 2 and "'MatMul=int8' is not OP=half or OP=float32" in err


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_export_writes_the_precision_asked_for(capsys, model_path: Path, tmp_path: Path, precision: str):
    assert _generate(capsys, model_path, tmp_path / "art", "--precision", "bf16")[0] == 0
    out = tmp_path / "model.onnx"
    status, printed, err = cli(capsys, "export", tmp_path / "art", "-o", out, "--precision", precision)
    assert status == 0, err
    # the float32 input is named so whether onnxruntime could load the model here or not (a half one it cannot,
    # which the command then describes from the graph)
    assert "inputs:  x: float32[batch, 4]" in printed, printed
    exported = onnx.load(out)
    onnx.checker.check_model(exported, full_check=True)
    kinds = {t.data_type for t in exported.graph.initializer}
    half = {"fp32": None, "fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[precision]
    assert (half in kinds) if half else kinds == {onnx.TensorProto.FLOAT}


def test_requires_grad_takes_adapters_and_globs(capsys, tmp_path: Path):
    """``adapters``: the LoRA adapters add_adapters added; a glob: the float initializers it matches; both
    refused where they name nothing, with what there is."""
    from onnxtrain.lora import add_adapters
    from tests.cli.helpers import tiny_mlp

    adapted, adapters = add_adapters(tiny_mlp(), targets=["linear.weight_*"], rank=2, alpha=4)
    onnx.save(adapted, tmp_path / "adapted.onnx")
    onnx.save(tiny_mlp(), tmp_path / "plain.onnx")
    loss = ["--loss", "ce"]
    for request, expected in (
        (["adapters"], adapters),
        (["*lora_A*"], [name for name in adapters if "lora_A" in name]),
        (["adapters", "linear.bias_?"], [*adapters, "linear.bias_1", "linear.bias_7"]),
    ):
        out = tmp_path / "-".join(request).replace("*", "x").replace("?", "q")
        argv = ["generate", tmp_path / "adapted.onnx", "--requires-grad", *request, *loss, "-o", out]
        status, _, err = cli(capsys, *argv)
        assert (status, err) == (0, ""), err
        assert sorted(checkpoint.load(out / "checkpoint").trainable) == sorted(expected), request
    status, _, err = cli(capsys, "generate", tmp_path / "plain.onnx", "--requires-grad", "adapters", *loss, "-o",
                         tmp_path / "none")  # fmt: skip
    assert_error(err, "generate", "has no LoRA adapters to train", "add_adapters")
    status, _, err = cli(capsys, "generate", tmp_path / "plain.onnx", "--requires-grad", "*lora*", *loss, "-o",
                         tmp_path / "none")  # fmt: skip
    assert_error(err, "generate", "'*lora*' matches no float initializer", "linear.weight_0")
    status, out, _ = cli(capsys, "inspect", tmp_path / "adapted.onnx")
    assert "LoRA adapters: 2 (rank 2), on linear.weight_0, linear.weight_6" in out
    assert "--requires-grad adapters trains them" in out
