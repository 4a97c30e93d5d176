"""Parameters an exporter stored once for their equal values are trained apart, as torch trains them.

torch's TorchScript exporter in its default evaluation mode (and Hugging Face
Optimum through it) makes each parameter equal to an earlier one an
``Identity`` of it: a fresh model's zero biases and unit LayerNorm scales all
read one tensor. The promise: each becomes an initializer of its own, under
its torch name, before the parameters are listed or trained; the constants
the exporter computed and merged are untied where another module reads them
and stay one where one module does (as the nodes' names say), and are said
where the names do not tell; the model computes what it computed; nothing
else is untied; the caller's model is not changed. Exports for inference of
convolutions with BatchNorm merged in are said too.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.graph.passes.untie import identity_copies, merged_constants, untie_identity_copies
from tests.graph.inference_exports import assert_trains_as_torch, export_for_inference
from tests.helpers import FLOAT, make_model, run_model


def _merged() -> onnx.ModelProto:
    """``y = ((x @ w + z) * p1 * one + p2``, ``p1`` and ``p2`` the exporter's ``Identity`` copies of ``one``
    (ones) and ``z`` (zeros); ``w`` read through one ``Identity`` that alone reads it (a converter's read of a
    variable); ``out``, an ``Identity`` of ``z`` that is a graph output."""
    nodes = [
        helper.make_node("Identity", ["z"], ["p2"], name="copy_p2"),
        helper.make_node("Identity", ["one"], ["p1"], name="copy_p1"),
        helper.make_node("Identity", ["w"], ["w_read"], name="read_w"),
        helper.make_node("Identity", ["z"], ["out"], name="out_of_z"),
        helper.make_node("MatMul", ["x", "w_read"], ["m"]),
        helper.make_node("Add", ["m", "z"], ["h"]),
        helper.make_node("Mul", ["h", "p1"], ["h1"]),
        helper.make_node("Mul", ["h1", "one"], ["h2"]),
        helper.make_node("Add", ["h2", "p2"], ["y"]),
    ]
    return make_model(
        {"x": (FLOAT, ["n", 3])},
        nodes,
        {"y": (FLOAT, ["n", 3]), "out": (FLOAT, [3])},
        [("z", np.zeros(3, np.float32)), ("one", np.ones(3, np.float32)), ("w", np.eye(3, dtype=np.float32) + 0.5)],
    )


def test_each_identity_copy_of_a_shared_initializer_becomes_an_initializer_of_its_own():
    model = _merged()
    assert identity_copies(model) == {"p2": "z", "p1": "one"}
    before = model.SerializeToString()
    untied = untie_identity_copies(onnx.load_from_string(before))
    tensors = {t.name: numpy_helper.to_array(t) for t in untied.graph.initializer}
    assert set(tensors) == {"z", "one", "w", "p1", "p2"}
    np.testing.assert_array_equal(tensors["p2"], tensors["z"])
    np.testing.assert_array_equal(tensors["p1"], tensors["one"])
    kept = [(n.input[0], n.output[0]) for n in untied.graph.node if n.op_type == "Identity"]
    assert kept == [("w", "w_read"), ("z", "out")]  # a lone read and a graph output stay
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    for got, want in zip(run_model(untied, {"x": x}), run_model(onnx.load_from_string(before), {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_initializer_only_copies_read_is_dropped_and_a_model_without_copies_is_unchanged():
    nodes = [helper.make_node("Identity", ["b"], [name]) for name in ("b1", "b2")]
    nodes.append(helper.make_node("Sum", ["x", "b1", "b2"], ["y"]))
    model = make_model({"x": (FLOAT, [2])}, nodes, {"y": (FLOAT, [2])}, [("b", np.zeros(2, np.float32))])
    untied = untie_identity_copies(model)
    assert [t.name for t in untied.graph.initializer] == ["b1", "b2"]
    assert [n.op_type for n in untied.graph.node] == ["Sum"]
    plain = make_model({"x": (FLOAT, [2])}, [helper.make_node("Identity", ["x"], ["y"])])
    assert untie_identity_copies(onnx.load_from_string(plain.SerializeToString())) == plain


def test_the_parameters_are_listed_and_written_untied_and_the_callers_model_is_not_changed(tmp_path: Path):
    """By path with external data (the copies read the same bytes) and from a ``ModelProto``."""
    model = _merged()
    before = model.SerializeToString()
    assert artifacts.trainable_parameters(model) == ["z", "one", "w", "p2", "p1"]
    assert model.SerializeToString() == before
    path = tmp_path / "model.onnx"
    stored = onnx.load_from_string(before)  # onnx.save moves the data of the model it is given
    onnx.save(stored, str(path), save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=0)
    for source in (model, path):
        paths = artifacts.generate_artifacts(
            source, requires_grad=["p1", "p2", "z"], frozen_params=["one", "w"],
            loss=artifacts.LossType.MSELoss, optimizer="SGD", artifact_directory=tmp_path / "artifacts",
        )  # fmt: skip
        state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
        np.testing.assert_array_equal(state.parameters["p1"].data, np.ones(3, np.float32))
        np.testing.assert_array_equal(state.parameters["p2"].data, np.zeros(3, np.float32))
    assert model.SerializeToString() == before


def _fresh_module(torch):
    """Two linear layers with zero biases and a LayerNorm: three zero vectors, equal when fresh."""

    class Fresh(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.norm = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)
            torch.nn.init.zeros_(self.a.bias)
            torch.nn.init.zeros_(self.b.bias)

        def forward(self, x):
            return self.norm(self.b(torch.tanh(self.a(x))))

    torch.manual_seed(0)
    return Fresh()


def test_a_fresh_model_exported_for_inference_trains_every_parameter_as_torch(tmp_path: Path):
    torch = pytest.importorskip("torch")
    module = _fresh_module(torch)
    model = export_for_inference(module, torch.ones(2, 4), ["x"], ["y"])
    assert identity_copies(model), "the exporter no longer merges equal parameters: the test needs a merge"
    rng = np.random.default_rng(3)
    batch = {"x": rng.normal(size=(5, 4)).astype(np.float32), "target": rng.normal(size=(5, 4)).astype(np.float32)}
    assert_trains_as_torch(model, module, artifacts.LossType.MSELoss, torch.nn.functional.mse_loss, batch, tmp_path)


def test_convolutions_the_exporter_computed_for_inference_are_said_and_a_training_export_is_silent(
    tmp_path: Path,
):
    """A ``BatchNorm2d`` after a convolution is merged into it when exported for inference: its weights become
    constants ``onnx::Conv_N``, trained as plain weights. Exported for training, nothing is said."""
    torch = pytest.importorskip("torch")
    from onnxtrain.artifacts.exported_parameters import TorchExportWarning
    from tests.helpers import export_for_training

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten())
    example = torch.ones(1, 2, 5, 5)
    model = export_for_inference(module.eval(), example, ["x"], ["y"])
    weights = artifacts.trainable_parameters(model)
    assert not any(node.op_type == "BatchNormalization" for node in model.graph.node)
    assert weights and all(name.startswith("onnx::Conv_") for name in weights), weights
    with pytest.warns(TorchExportWarning, match=r"onnx::Conv_\d+.*computed for inference.*TrainingMode\.TRAINING"):
        artifacts.build_artifacts(model, requires_grad=weights, loss=artifacts.LossType.MSELoss)
    trained = export_for_training(module.train(), (example,), ["x"], ["y"], opset=17)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchExportWarning)
        artifacts.build_artifacts(
            trained, requires_grad=artifacts.trainable_parameters(trained), loss=artifacts.LossType.MSELoss
        )


def _applied_twice(torch, copied: bool):
    """A ``Linear`` applied twice to a sequence (``copied``: its copy applied the second time, as
    ``nn.TransformerEncoder`` copies one layer to make its layers), then a head."""

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)
            self.again = copy.deepcopy(self.layer) if copied else self.layer

        def forward(self, x):
            return self.head(torch.tanh(self.again(torch.tanh(self.layer(x)))))

    torch.manual_seed(0)
    return Twice()


@pytest.mark.parametrize("copied", [False, True], ids=["one layer applied twice", "a layer and its copy"])
def test_the_exporters_merged_constants_stay_one_weight_where_one_module_reads_them(copied: bool, tmp_path: Path):
    """The exporter folds the weight's transpose at each application and merges the two equal constants
    (``onnx::MatMul_N``, an ``Identity`` of the other). Read by one module (``/layer/MatMul``,
    ``/layer_1/MatMul``) they stay one weight, whose gradient is the sum of both uses; read by a module and its
    copy (``/layer/MatMul``, ``/again/MatMul``) they are two, each with its own gradient, as torch's."""
    torch = pytest.importorskip("torch")
    module = _applied_twice(torch, copied)
    model = export_for_inference(module, torch.ones(2, 5, 4), ["x"], ["y"])
    merged = [(n.input[0], n.output[0]) for n in model.graph.node if n.op_type == "Identity"]
    constants = [pair for pair in merged if pair[1].startswith("onnx::")]
    assert len(constants) == 1 and constants[0][0].startswith("onnx::"), merged
    (source, copied_as), *_ = constants
    biases = {"again.bias": "layer.bias"} if copied else {}  # the copy's bias too, a parameter of torch's
    assert identity_copies(model) == ({copied_as: source, **biases} if copied else {})
    assert merged_constants(model) == {}
    weights = artifacts.trainable_parameters(model)
    assert len(weights) == len(list(module.parameters())) == (6 if copied else 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: the names tell
        paths = artifacts.generate_artifacts(
            model, requires_grad=weights, loss=artifacts.LossType.MSELoss, optimizer="SGD", artifact_directory=tmp_path
        )
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    trained = api.Module(paths["training_model"], state, paths["eval_model"])
    rng = np.random.default_rng(5)
    x, target = rng.normal(size=(2, 5, 4)).astype(np.float32), rng.normal(size=(2, 5, 3)).astype(np.float32)
    loss = float(np.asarray(trained(x, target)))
    want = torch.nn.functional.mse_loss(module(torch.from_numpy(x)), torch.from_numpy(target))
    want.backward()
    np.testing.assert_allclose(loss, float(want.detach()), rtol=1e-6)
    np.testing.assert_allclose(state.parameters[source].grad, module.layer.weight.grad.numpy().T, rtol=1e-5, atol=1e-7)
    if copied:
        np.testing.assert_allclose(
            state.parameters[copied_as].grad, module.again.weight.grad.numpy().T, rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(
            state.parameters["again.bias"].grad, module.again.bias.grad.numpy(), rtol=1e-5, atol=1e-7
        )


def test_merged_constants_whose_readers_names_tell_nothing_stay_tied_and_are_said():
    """Nodes not named by module path: the merge cannot be told apart from a shared layer's, and is said."""
    from onnxtrain.artifacts.exported_parameters import TorchExportWarning

    w = np.arange(9, dtype=np.float32).reshape(3, 3) / 7
    nodes = [
        helper.make_node("Identity", ["onnx::MatMul_1"], ["onnx::MatMul_2"]),
        helper.make_node("MatMul", ["x", "onnx::MatMul_1"], ["h"], name="first"),
        helper.make_node("MatMul", ["h", "onnx::MatMul_2"], ["y"], name="second"),
    ]
    model = make_model({"x": (FLOAT, ["n", 3])}, nodes, {"y": (FLOAT, ["n", 3])}, [("onnx::MatMul_1", w)])
    assert identity_copies(model) == {}
    assert merged_constants(model) == {"onnx::MatMul_2": "onnx::MatMul_1"}
    with pytest.warns(TorchExportWarning, match=r"onnx::MatMul_2 is onnx::MatMul_1.*export in training mode"):
        artifacts.build_artifacts(model, requires_grad=["onnx::MatMul_1"], loss=artifacts.LossType.MSELoss)
