"""A loss's target takes its output's shape from the graph where the declaration is wrong.

torch's TorchScript exporter declares each axis of ``dynamic_axes`` as named:
``{"y": {0: "N", 1: "N"}}`` on a flattened decoder output declares ``[N, N]``,
though its second axis is ``C * H' * W'``. A loss that copied that shape gave
its target ``[N, N]``, and the first step failed with ``input 'target' of the
training model has N = 256, but input 'x' has N = 5``. Now the declaration is
checked against the graph (:mod:`onnxtrain.graph.declared`): a contradicted
axis takes the inferred size, with a :class:`DeclaredShapeWarning` naming the
output. A declaration no inference can check is kept, and the target input's
``doc_string`` says where its shape comes from, for the run-time error.
"""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import api, artifacts
from onnxtrain.graph.declared import DeclaredShapeWarning, check_output_shape
from tests.helpers import FLOAT, INT64, make_model


def _dims(value: onnx.ValueInfoProto) -> list[int | str | None]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in value.type.tensor_type.shape.dim]


def _declare(model: onnx.ModelProto, output: str, dims: list[int | str]) -> onnx.ModelProto:
    """``model`` with ``output`` declared ``float[dims]``."""
    for value in model.graph.output:
        if value.name == output:
            value.CopyFrom(helper.make_tensor_value_info(output, FLOAT, dims))
    return model


def _flatten_model(declared: list[int | str]) -> onnx.ModelProto:
    """``y = Flatten(x)`` for ``x: float[N, 4, 4]``: really ``float[N, 16]``, declared ``float[declared]``."""
    model = make_model({"x": (FLOAT, ["N", 4, 4])}, [helper.make_node("Flatten", ["x"], ["y"], axis=1)], ["y"])
    return _declare(model, "y", declared)


def _resize_model(declared: list[int | str]) -> onnx.ModelProto:
    """``y = Flatten(Resize(x, scales 2))`` for ``x: float[N, 1, H, W]``: really ``float[N, 4 H W]``."""
    scales = helper.make_tensor("scales", FLOAT, [4], [1.0, 1.0, 2.0, 2.0])
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("Flatten", ["r"], ["y"], axis=1),
    ]
    model = make_model({"x": (FLOAT, ["N", 1, "H", "W"])}, nodes, ["y"], initializers=[scales])
    return _declare(model, "y", declared)


def _target(paths: dict[str, Path]) -> onnx.ValueInfoProto:
    graph = onnx.load(paths["training_model"]).graph
    return next(value for value in graph.input if value.name == "target")


def _generate(model: onnx.ModelProto, directory: Path, requires_grad: list[str] | None = None) -> dict[str, Path]:
    return artifacts.generate_artifacts(
        model, requires_grad=requires_grad or [], loss=artifacts.LossType.MSELoss, artifact_directory=directory
    )


# ---------------------------------------------------------------- the check on hand-built graphs


@pytest.mark.parametrize(
    ("declared", "contradicted", "inferred"),
    [
        (["N", "N"], (1,), ("N", 16)),  # a reused name: the symbolic pass gives 16
        (["N", 99], (1,), ("N", 16)),  # a wrong size
        (["N", 16], (), ("N", 16)),  # right
        (["M", 16], (), ("N", 16)),  # a name no input uses claims nothing
        ([3, 16], (0,), ("N", 16)),  # a size for the batch: not what the graph computes for other batches
    ],
)
def test_declared_flatten_shapes_are_checked_against_the_graph(
    declared: list[int | str], contradicted: tuple[int, ...], inferred: tuple[int | str, ...]
) -> None:
    check = check_output_shape(_flatten_model(declared), "y")
    assert check is not None
    assert check.declared == tuple(declared)
    assert check.inferred == inferred
    assert check.contradicted == contradicted
    assert check.undecided() == ()


def test_resize_then_flatten_is_refuted_by_the_counterexample_sizes() -> None:
    """The symbolic pass knows nothing after a Resize by scales; the sizes H = 17, N = 19, W = 23 decide."""
    check = check_output_shape(_resize_model(["N", "N"]), "y")
    assert check is not None
    assert check.inferred == (None, None)
    assert dict(check.sizes) == {"H": 17, "N": 19, "W": 23}
    assert check.at_sizes == (19, 4 * 17 * 23)
    assert check.contradicted == (1,)
    assert check.corrected(["N", "N"]) == ["N", None]
    assert "axis 1 is 1564, not N = 19" in check.message("float")


def test_no_declared_shape_no_check() -> None:
    model = make_model({"x": (FLOAT, ["N", 4, 4])}, [helper.make_node("Flatten", ["x"], ["y"], axis=1)], ["y"])
    model.graph.output[0].type.tensor_type.ClearField("shape")
    assert check_output_shape(model, "y") is None
    assert check_output_shape(model, "not_an_output") is None


# ---------------------------------------------------------------- the loss's target


def test_the_target_takes_the_inferred_shape_with_a_warning_naming_the_output(tmp_path: Path) -> None:
    with pytest.warns(DeclaredShapeWarning, match=r"output 'y' of the model is declared float\[N, N\].*axis 1 is 16"):
        paths = _generate(_flatten_model(["N", "N"]), tmp_path)
    assert _dims(_target(paths)) == ["N", 16]


def test_a_right_declaration_gives_no_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeclaredShapeWarning)
        paths = _generate(_flatten_model(["N", 16]), tmp_path)
    assert _dims(_target(paths)) == ["N", 16]
    assert _target(paths).doc_string == ""


def _nonzero_model() -> onnx.ModelProto:
    """``y = ReduceSum(Cast(NonZero(x)), axis 0)``, declared ``float[N]``: its size depends on the data."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Cast", ["nz"], ["nzf"], to=FLOAT),
        helper.make_node("ReduceSum", ["nzf", "zero"], ["y"], keepdims=0),
    ]
    zero = helper.make_tensor("zero", INT64, [1], [0])
    return make_model({"x": (FLOAT, ["N"])}, nodes, {"y": (FLOAT, ["N"])}, initializers=[zero], opset=17)


def test_an_unverifiable_declaration_is_kept_and_the_target_says_where_it_comes_from(tmp_path: Path) -> None:
    """No inference can check ``[N]`` after ``NonZero``: the declaration stays, the target input records it."""
    check = check_output_shape(_nonzero_model(), "y")
    assert check is not None and check.contradicted == () and check.undecided() == (0,)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeclaredShapeWarning)
        paths = _generate(_nonzero_model(), tmp_path)
    target = _target(paths)
    assert _dims(target) == ["N"]
    assert re.search(r"model output 'y', declared float\[N\].*could not check axis 0", target.doc_string)


def test_the_run_time_error_of_an_unverifiable_declaration_names_the_output(tmp_path: Path) -> None:
    paths = _generate(_nonzero_model(), tmp_path)
    module = api.Module(paths["training_model"], api.CheckpointState.load_checkpoint(paths["checkpoint"]))
    with pytest.raises(ValueError, match=r"N = 5, but input 'x' has N = 4") as error:
        module(np.array([1, 0, 2, 3], np.float32), np.zeros(5, np.float32))
    assert "model output 'y', declared float[N]" in str(error.value), str(error.value)


# ---------------------------------------------------------------- torch's exporter, end to end


def _autoencoder(torch: Any) -> Any:
    functional = torch.nn.functional

    class AutoEncoder(torch.nn.Module):
        """A stride-2 conv encoder, a nearest ``F.interpolate`` by 2 and a conv decoder, flattened."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = torch.nn.Conv2d(1, 4, 3, stride=2, padding=1)
            self.decoder = torch.nn.Conv2d(4, 1, 3, padding=1)

        def forward(self, x: Any) -> Any:
            h = functional.interpolate(torch.relu(self.encoder(x)), scale_factor=2.0, mode="nearest")
            return torch.flatten(self.decoder(h), 1)

    torch.manual_seed(0)
    return AutoEncoder()


def _export(torch: Any, module: Any) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            (torch.zeros(5, 1, 16, 16),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "N", 2: "H", 3: "W"}, "y": {0: "N", 1: "N"}},  # "N" reused: the quirk
        )
    return onnx.load_from_string(buffer.getvalue())


def test_torch_autoencoder_declared_n_by_n_trains_with_torchs_gradients(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = _autoencoder(torch)
    model = _export(torch, module)
    assert _dims(model.graph.output[0]) == ["N", "N"], "the exporter no longer declares [N, N]: the quirk is gone"
    parameters = [name for name, _ in module.named_parameters()]
    with pytest.warns(DeclaredShapeWarning, match=r"output 'y' of the model is declared float\[N, N\]"):
        paths = _generate(model, tmp_path, parameters)
    assert _dims(_target(paths)) == ["N", None]
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    trainer = api.Module(paths["training_model"], state, paths["eval_model"])
    rng = np.random.default_rng(0)
    for batch, height, width in ((5, 16, 16), (3, 12, 20)):
        x = rng.normal(size=(batch, 1, height, width)).astype(np.float32)
        target = rng.normal(size=(batch, height * width)).astype(np.float32)
        trainer.lazy_reset_grad()
        loss = float(trainer(x, target))
        module.zero_grad(set_to_none=True)
        want = torch.nn.functional.mse_loss(module(torch.from_numpy(x)), torch.from_numpy(target))
        want.backward()
        np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
        for name, parameter in module.named_parameters():
            expected = parameter.grad.numpy()
            np.testing.assert_allclose(
                state.parameters[name].grad, expected, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(expected).max()))
            )


# ---------------------------------------------------------------- dimension names that are expressions

#: How torch's dynamo exporter names the height after a stride-2 conv and a ConvTranspose back (equal to h).
ODD = "2*(((h - 1)//2)) + 1"


def _with_a_copied_expression(declared: list[int | str]) -> onnx.ModelProto:
    """``y = Identity(x)`` for ``x: float[N, h]``, declared ``float[declared]``, and the input a loss's
    ``InputLike`` target adds with the declaration's names (``onehot: float[N, 2*(((h - 1)//2)) + 1]``)."""
    model = make_model(
        {"x": (FLOAT, ["N", "h"]), "onehot": (FLOAT, ["N", ODD])},
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["onehot"], ["o"])],
        ["y", "o"],
    )
    return _declare(model, "y", declared)


def test_an_expression_of_input_dimensions_is_not_a_size_of_its_own() -> None:
    """The input's ``2*(((h - 1)//2)) + 1`` is no free symbol: the counterexample pass gives it the size the
    expression takes at h's (29 at h = 23), not a prime of its own; the output declared with it is not
    contradicted (it used to be: ``axis 1 is 23, not 2*(((h - 1)//2)) + 1 = 17``)."""
    check = check_output_shape(_with_a_copied_expression(["N", ODD]), "y")
    assert check is not None
    assert check.contradicted == ()
    assert dict(check.sizes) == {"N": 17, "h": 19}
    assert check.bound == {"N", "h"}
    # a wrong size is still refuted
    assert check_output_shape(_with_a_copied_expression(["N", 5]), "y").contradicted == (1,)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "size"),
    [(ODD, 19), ("h*h", 361), ("Max(1, h - 18)", 1), ("h**2", 361), ("2*h/3", None), ("h - 19", None)],
)
def test_an_input_dimension_named_by_an_expression_takes_its_value(name: str, size: int | None) -> None:
    """``z: float[N, name]`` beside ``x: float[N, h]``: in the counterexample pass ``z``'s axis has the
    expression's value at h = 19 (``None``, unknown, where it is no whole positive number); ``z`` is read back
    through an ``Identity`` declared with nothing, so its inferred size shows it."""
    model = make_model(
        {"x": (FLOAT, ["N", "h"]), "z": (FLOAT, ["N", name])},
        [helper.make_node("Identity", ["z"], ["y"])],
        ["y"],
    )
    model = _declare(model, "y", ["N", 7])  # a declaration, so that the passes run
    check = check_output_shape(model, "y")
    assert check is not None
    assert check.at_sizes == (17, size)


def test_a_name_that_only_looks_like_an_expression_is_its_own_symbol() -> None:
    """``batch-size`` of names no input uses alone, ``seq len``: dimension names, each its own size."""
    model = make_model(
        {"x": (FLOAT, ["batch-size", "seq len"])}, [helper.make_node("Flatten", ["x"], ["y"], axis=1)], ["y"]
    )
    check = check_output_shape(_declare(model, "y", ["batch-size", "batch-size"]), "y")
    assert check is not None
    assert check.bound == {"batch-size", "seq len"}
    assert check.contradicted == (1,)


def test_labels_of_a_contradicted_output_are_described_as_the_labels() -> None:
    """CrossEntropyLoss's labels of scores declared ``[N, N]`` (really ``[N, 16]``), built on a base whose
    declarations were not corrected first (as when a block's added input is what reveals the contradiction): the
    warning gives the labels' type and shape, ``int64[N]``, not the scores' (``float[N,16]``, the class axis)."""
    from onnxtrain import onnxblock
    from onnxtrain.graph.context import loaded_base

    with loaded_base(_flatten_model(["N", "N"]), None) as builder:
        with pytest.warns(DeclaredShapeWarning, match=r"shapes its target 'labels' after int64\[N\] instead") as said:
            onnxblock.loss.CrossEntropyLoss()("y")
        labels = next(v for v in builder.model.graph.input if v.name == "labels")
    assert all("float[N,16] instead" not in str(w.message) for w in said)
    assert _dims(labels) == ["N"]


def test_torch_dynamo_export_with_an_input_like_target_gives_no_warning(tmp_path: Path) -> None:
    """A user's CE + one-hot term over a conv then a ConvTranspose exported by dynamo (height declared
    ``2*(((h - 1)//2)) + 1``, h for the odd sizes it takes): no DeclaredShapeWarning, as with the built-in loss
    alone; it used to say the declaration was contradicted at h = 29."""
    torch = pytest.importorskip("torch")
    from onnxtrain import onnxblock

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
            self.up = torch.nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1)

        def forward(self, x: Any) -> Any:
            return self.up(torch.relu(self.down(x)))

    class CEPlusOneHotTerm(onnxblock.Block):
        def __init__(self) -> None:
            super().__init__()
            self.ce = onnxblock.loss.CrossEntropyLoss()

        def build(self, logits: str) -> str:
            onehot = onnxblock.blocks.InputLike(logits)("onehot")
            p = onnxblock.blocks.Softmax(axis=1)(logits)
            term = onnxblock.blocks.ReduceMean(keepdims=False)(onnxblock.blocks.Mul()(p, onehot))
            return onnxblock.blocks.Add()(self.ce(logits), term)

    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dims = {0: torch.export.Dim("batch"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")}
        torch.onnx.export(
            Net(), (torch.randn(2, 3, 37, 53),), path, dynamo=True, optimize=False, input_names=["x"],
            output_names=["logits"], dynamic_shapes={"x": dims}, verbose=False,
        )  # fmt: skip
    declared = _dims(onnx.load(path).graph.output[0])
    if not any(isinstance(d, str) and "//" in d for d in declared):
        pytest.skip(f"this exporter declares {declared}, no expression")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeclaredShapeWarning)
        paths = artifacts.generate_artifacts(
            path, requires_grad=artifacts.trainable_parameters(path), loss=CEPlusOneHotTerm(),
            optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path / "a",
        )  # fmt: skip
    labels = next(v for v in onnx.load(paths["training_model"]).graph.input if v.name == "labels")
    assert _dims(labels) == ["batch", declared[2], declared[3]]
