"""BatchNormalization's running statistics: recognised wherever the lists put them, updated, never trained; an
InstanceNorm's, which an export leaves out, said to be lost."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import api, optim
from onnxtrain.artifacts import LossType, RunningStatisticsWarning, build_artifacts, generate_artifacts
from onnxtrain.artifacts.exported_parameters import TorchExportWarning
from onnxtrain.graph.roles import trainable_parameters
from tests.helpers import export_for_training

STATISTICS = ["bn.running_mean", "bn.running_var"]


def _torch_net(*, two_views: bool = False):
    """``fc -> bn -> relu -> head``; ``two_views``: SimCLR's pattern, one head, its BatchNorm included, applied
    to two views of ``x: [N, 8]`` in one forward (no relu)."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.bn = torch.nn.BatchNorm1d(3)
            self.head = torch.nn.Linear(3, 2)

        def forward(self, x):
            if two_views:
                first, second = x[:, :4], x[:, 4:]
                return self.head(self.bn(self.fc(first))) + self.head(self.bn(self.fc(second * 2.0)))
            return self.head(torch.relu(self.bn(self.fc(x))))

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # statistics away from their defaults, so that a wrong update shows
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
    return torch, net


def _batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        (rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)) for _ in range(steps)
    ]


def _torch_run(torch, net, batches, weight_decay: float) -> dict[str, np.ndarray]:
    """``batches`` of SGD(lr=1, weight_decay) on the mean squared error in torch; every parameter and buffer
    (the running variance updated with the unbiased batch variance, as the artifacts of a torch export do)."""
    net.train()
    sgd = torch.optim.SGD(net.parameters(), lr=1.0, weight_decay=weight_decay)
    for x, t in batches:
        sgd.zero_grad()
        torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(t)).backward()
        sgd.step()
    return {name: value.detach().numpy() for name, value in net.state_dict().items() if "num_batches" not in name}


def _our_run(tmp_path, model, requires_grad, frozen, batches, weight_decay: float) -> tuple[dict, dict]:
    paths = generate_artifacts(
        model, requires_grad=requires_grad, frozen_params=frozen, loss=LossType.MSELoss,
        optimizer=optim.SGD(weight_decay=weight_decay), artifact_directory=tmp_path,
    )  # fmt: skip
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    optimizer.set_learning_rate(1.0)
    for x, t in batches:
        module(x, t)
        optimizer.step()
        module.lazy_reset_grad()
    values = {name: parameter.data for name, parameter in state.parameters}
    trainable = {name for name, parameter in state.parameters if parameter.requires_grad}
    return values, {"trainable": trainable}


def _assert_as_torch(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_statistics_named_in_requires_grad_are_updated_not_trained_with_a_warning(tmp_path):
    """All initializers in requires_grad, SGD with weight decay 0.5 at lr 1: weight decay must not shrink the
    statistics (it halved running_mean); they are updated as torch updates its buffers."""
    torch, net = _torch_net()
    model = export_for_training(net, (torch.zeros(8, 4),), ["x"], ["y"], opset=17)
    everything = [t.name for t in model.graph.initializer]
    assert set(STATISTICS) <= set(everything)
    batches = _batches(1)
    with pytest.warns(RunningStatisticsWarning, match="bn.running_mean"):
        ours, info = _our_run(tmp_path, model, everything, [], batches, 0.5)
    assert not set(STATISTICS) & info["trainable"]
    _assert_as_torch(ours, _torch_run(torch, net, batches, 0.5))


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
def test_statistics_no_list_names_are_parameters_updated_at_each_step(tmp_path, opset: int):
    """The README's pattern: requires_grad lists the parameters, frozen_params=[]; the statistics (in neither)
    were constants and never changed. Before opset 14 the normalization has no ``training_mode``: its optional
    outputs switch training on (converted to opset 13 from 9 and 11), and were not taken for it."""
    torch, net = _torch_net()
    model = export_for_training(net, (torch.zeros(8, 4),), ["x"], ["y"], opset=opset, dynamic_axes={"x": {0: "n"}})
    parameters = [name for name, _ in net.named_parameters()]
    batches = _batches(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunningStatisticsWarning)  # nothing to warn about
        ours, info = _our_run(tmp_path, model, parameters, [], batches, 0.0)
    assert info["trainable"] == set(parameters)
    _assert_as_torch(ours, _torch_run(torch, net, batches, 0.0))
    # the eval model normalizes with the running statistics: a row alone gives what it gives in a batch
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert [len(n.output) for n in eval_model.graph.node if n.op_type == "BatchNormalization"] == [1]
    session = ort.InferenceSession(eval_model.SerializeToString(), providers=["CPUExecutionProvider"])
    x, target = batches[0]
    feeds = {"target": target, **{name: value for name, value in ours.items() if name in _inputs(eval_model)}}
    whole = session.run(None, {**feeds, "x": x})[0]  # the mean squared error over the batch
    rows = [session.run(None, {**feeds, "x": x[i : i + 1], "target": target[i : i + 1]})[0] for i in range(len(x))]
    np.testing.assert_allclose(np.mean(rows), whole, rtol=1e-5)


def _inputs(model) -> set[str]:
    return {value.name for value in model.graph.input}


def test_statistics_in_frozen_params_are_updated_too(tmp_path):
    torch, net = _torch_net()
    model = export_for_training(net, (torch.zeros(8, 4),), ["x"], ["y"], opset=17)
    parameters = [name for name, _ in net.named_parameters()]
    batches = _batches(2)
    ours, _ = _our_run(tmp_path, model, parameters, STATISTICS, batches, 0.0)
    _assert_as_torch(ours, _torch_run(torch, net, batches, 0.0))


def test_statistics_of_an_inference_mode_normalization_stay_constant_and_untrained(tmp_path):
    """An eval-mode export normalizes with its running statistics and never updates them (as torch in eval mode):
    named in requires_grad they are not trained either."""
    torch, net = _torch_net()
    net.eval()
    model = export_for_training(net, (torch.zeros(8, 4),), ["x"], ["y"], opset=17)
    for node in model.graph.node:  # as an inference export writes it
        if node.op_type == "BatchNormalization":
            for attribute in node.attribute:
                if attribute.name == "training_mode":
                    attribute.i = 0
            del node.output[1:]
    before = {name: value.detach().numpy().copy() for name, value in net.named_buffers()}
    with pytest.warns(RunningStatisticsWarning):
        ours, info = _our_run(tmp_path, model, [t.name for t in model.graph.initializer], [], _batches(2), 0.5)
    assert not set(STATISTICS) & info["trainable"]
    for name in STATISTICS:
        np.testing.assert_array_equal(ours[name], before[name])


def _dynamo_export(torch, net):
    """``net`` exported by torch's dynamo exporter, every parameter and buffer under torch's name."""
    pytest.importorskip("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes
        program = torch.onnx.export(
            net, (torch.zeros(8, 4),), dynamo=True, optimize=False, input_names=["x"], output_names=["y"],
            verbose=False,
        )  # fmt: skip
    return program.model_proto


def test_a_dynamo_export_in_training_mode_normalizes_and_updates_as_torch(tmp_path):
    """torch's dynamo exporter writes BatchNorm in inference mode whatever the module's mode; the FX node says
    torch ran it in training mode, so the training model normalizes with the batch's statistics and updates
    the running ones, as torch does and as the TorchScript export is trained."""
    torch, net = _torch_net()
    model = _dynamo_export(torch, net.train())
    parameters = [name for name, _ in net.named_parameters()]
    batches = _batches(3)
    ours, info = _our_run(tmp_path, model, parameters, [], batches, 0.0)
    assert info["trainable"] == set(parameters)
    _assert_as_torch(ours, _torch_run(torch, net, batches, 0.0))


def test_a_dynamo_export_in_eval_mode_keeps_its_running_statistics(tmp_path):
    """An export of a module in eval mode (``_native_batch_norm_legit_no_training``) normalizes with the running
    statistics, which stay constants of the graph; torch.onnx.export's default mode, so generation says how the
    training differs from torch's train() and how to export for it."""
    import onnx

    torch, net = _torch_net()
    model = _dynamo_export(torch, net.eval())
    warned = r"1 BatchNormalization node\(s\) are in inference mode.*'bn\.running_mean'.*TrainingMode\.TRAINING"
    with pytest.warns(RunningStatisticsWarning, match=warned):
        paths = generate_artifacts(
            model, requires_grad=[name for name, _ in net.named_parameters()], loss=LossType.MSELoss,
            optimizer=optim.SGD(), artifact_directory=tmp_path,
        )  # fmt: skip
    training = onnx.load(str(paths["training_model"]))
    norms = [node for node in training.graph.node if node.op_type == "BatchNormalization"]
    assert len(norms) == 1 and len(norms[0].output) == 1
    assert all(attribute.name != "training_mode" or attribute.i == 0 for attribute in norms[0].attribute)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    assert not set(STATISTICS) & {name for name, _ in state.parameters}


@pytest.mark.parametrize("tracked", [True, False])
def test_an_instance_norm_that_tracks_running_statistics_is_said_to_lose_them(tracked: bool):
    """``nn.InstanceNorm2d(track_running_stats=True)``: the dynamo export reads no running statistics (ONNX's
    InstanceNormalization has none), so the eval model normalizes each sample as training does, where torch's
    eval mode would use the running ones; generation says so, naming the statistics."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3), torch.nn.InstanceNorm2d(2, affine=True, track_running_stats=tracked),
        torch.nn.Flatten(), torch.nn.Linear(32, 3),
    ).train()  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes
        model = torch.onnx.export(net, (torch.zeros(2, 1, 6, 6),), dynamo=True, optimize=False).model_proto
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_artifacts(model, requires_grad=trainable_parameters(model), loss=LossType.CrossEntropyLoss)
    said = [w for w in caught if issubclass(w.category, TorchExportWarning)]
    assert len(said) == int(tracked)
    if tracked:
        assert "running_mean" in str(said[0].message) and "track_running_stats=False" in str(said[0].message)


def test_a_scale_merged_with_a_running_statistic_by_the_exporter_is_said(tmp_path):
    """torch.onnx.export's default optimize=True merges tensors of equal values: on a fresh model the weight and
    the running variance (ones), the bias and the running mean (zeros). BatchNorm's weight and bias were then
    left out of the trainable parameters without a word."""
    from onnx import helper

    from tests.helpers import FLOAT, make_model

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("BatchNormalization", ["h", "bn.weight", "bn.bias", "bn.bias", "bn.weight"], ["y"]),
    ]
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    weights = [("w", np.ones((3, 4), np.float32)), ("bn.weight", ones), ("bn.bias", zeros)]
    model = make_model({"x": (FLOAT, ["N", 3])}, nodes, {"y": (FLOAT, ["N", 4])}, weights)
    said = r"one tensor as its scale or bias and as a running statistic.*optimize=False"
    with pytest.warns(RunningStatisticsWarning, match=said):
        generate_artifacts(model, requires_grad=["w"], loss=LossType.MSELoss, artifact_directory=tmp_path)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_normalization_applied_twice_in_a_forward_updates_its_statistics_twice_as_torch(tmp_path, exporter):
    """torch updates the buffers at each call, the second update from the first's result; only the first
    node's update was kept (dynamo), or the second node's from the statistics as they were (TorchScript)."""
    torch, net = _torch_net(two_views=True)
    example = torch.zeros(8, 8)
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.onnx.export(
                net.train(), (example,), dynamo=True, optimize=False, input_names=["x"], output_names=["y"]
            ).model_proto
    else:
        model = export_for_training(net, (example,), ["x"], ["y"], opset=17)
    rng = np.random.default_rng(2)
    batches = [  # small values: SGD at lr 1 does not diverge
        ((0.3 * rng.normal(size=(8, 8))).astype(np.float32), (0.1 * rng.normal(size=(8, 2))).astype(np.float32))
        for _ in range(3)
    ]
    parameters = [name for name, _ in net.named_parameters()]
    ours, _ = _our_run(tmp_path, model, parameters, [], batches, 0.0)
    _assert_as_torch(ours, _torch_run(torch, net, batches, 0.0))


def test_a_batch_of_one_value_per_channel_leaves_the_statistics_as_they_were(tmp_path):
    """A last batch of one row through BatchNorm1d, which torch refuses to train: its update set the running
    variance to exactly 0 (every later eval step divided by sqrt(eps)); it now changes neither statistic,
    and the batches before it update them as torch does."""
    torch, net = _torch_net()
    model = export_for_training(net, (torch.zeros(8, 4),), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "n"}})
    parameters = [name for name, _ in net.named_parameters()]
    batches = _batches(2)
    expected = _torch_run(torch, net, batches, 0.0)
    rng = np.random.default_rng(3)
    one_row = (rng.normal(size=(1, 4)).astype(np.float32), rng.normal(size=(1, 2)).astype(np.float32))
    ours, _ = _our_run(tmp_path, model, parameters, [], [*batches, one_row], 0.0)
    for name in STATISTICS:
        np.testing.assert_allclose(ours[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert (ours["bn.running_var"] > 0.1).all()


def test_a_normalization_over_statistics_the_graph_computes_is_not_said_to_be_in_eval_mode(tmp_path):
    """``BatchNorm2d(track_running_stats=False)`` as torch's dynamo exporter writes it: an inference-mode node
    over each batch's mean and variance, computed by ``ReduceMean``s. It was said to be an eval-mode export whose
    running statistics were constants."""
    from onnx import helper

    from tests.helpers import FLOAT, make_model

    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=0),
        helper.make_node("Unsqueeze", ["mean", "axes"], ["mean4"]),
        helper.make_node("Sub", ["x", "mean4"], ["centred"]),
        helper.make_node("Mul", ["centred", "centred"], ["squares"]),
        helper.make_node("ReduceMean", ["squares", "axes"], ["variance"], keepdims=0),
        helper.make_node("BatchNormalization", ["x", "bn.weight", "bn.bias", "mean", "variance"], ["y"]),
    ]
    model = make_model(
        {"x": (FLOAT, ["n", 3, 4, 4])},
        nodes,
        {"y": (FLOAT, ["n", 3, 4, 4])},
        [
            ("axes", np.array([0, 2, 3], np.int64)),
            ("bn.weight", np.ones(3, np.float32)),
            ("bn.bias", np.zeros(3, np.float32)),
        ],
        opset=18,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunningStatisticsWarning)
        generate_artifacts(
            model, requires_grad=["bn.weight", "bn.bias"], loss=LossType.MSELoss, artifact_directory=tmp_path
        )


def test_a_parameter_folded_with_its_normalization_into_a_convolution_is_explained_when_named(tmp_path):
    """torch.onnx.export's default (eval mode, constant folding) merges a BatchNorm into the convolution before
    it, whose weights become ``onnx::Conv_N``: naming torch's ``conv.weight`` was refused with near names of
    other layers, and the reason never given."""
    torch = pytest.importorskip("torch")

    class ConvBn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)
            self.head = torch.nn.Conv2d(4, 2, 1)

        def forward(self, x):
            return self.head(torch.relu(self.bn(self.conv(x))))

    import io

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ConvBn().eval(), (torch.randn(1, 3, 8, 8),), buffer, dynamo=False, input_names=["x"])
    model = onnx.load_from_string(buffer.getvalue())
    with pytest.raises(
        ValueError,
        match=r"computed convolutions' weights for inference \('/conv/Conv' reads onnx::Conv_.*TrainingMode.TRAINING",
    ):
        generate_artifacts(model, requires_grad=["conv.weight"], loss=LossType.MSELoss, artifact_directory=tmp_path)
    with pytest.raises(ValueError, match=r"no node of 'bn' is left: the exporter computed convolutions' weights"):
        generate_artifacts(model, requires_grad=["bn.weight"], loss=LossType.MSELoss, artifact_directory=tmp_path)
    assert not any(tmp_path.iterdir())
