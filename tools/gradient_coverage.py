"""Regenerate ``docs/gradient-coverage.md``: the rule table, the torch.nn layers, which rules differentiate twice.

``python tools/gradient_coverage.py`` (from the repository root) writes the whole document. The
torch.nn part exports every public ``torch.nn`` layer with small example inputs (TorchScript
exporter, training mode, opset :data:`OPSET`), checks that ``trainable_parameters`` names exactly
the layer's parameters, and that a training model over them builds and runs
(:func:`onnxtrain.autodiff.coverage.check_training`). Without torch, the registry part is
refreshed and the committed torch.nn part kept as it is.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

if not __package__:  # run as a script (`python tools/gradient_coverage.py`): make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxtrain.artifacts import trainable_parameters
from onnxtrain.autodiff.coverage import (
    LayerRow,
    TrainingCheck,
    check_training,
    coverage_markdown,
    layers_markdown,
    model_operators,
    split_document,
)

if TYPE_CHECKING:
    import torch

DOCUMENT = Path(__file__).resolve().parents[1] / "docs" / "gradient-coverage.md"
#: The opset the layers are exported at: the TorchScript exporter's default in torch 2.13.
OPSET = 20

#: Public torch.nn module classes that are not layers, and why they are left out of the table.
EXCLUDED = {
    "Module": "the base class of every layer",
    "Container": "a deprecated base class of containers",
    "Sequential": "a container: it trains when its layers do",
    "ModuleList": "a container: it trains when its layers do",
    "ModuleDict": "a container: it trains when its layers do",
    "ParameterList": "a container of parameters, with no forward",
    "ParameterDict": "a container of parameters, with no forward",
    "RNNBase": "the base class of RNN, GRU and LSTM",
    "RNNCellBase": "the base class of RNNCell, GRUCell and LSTMCell",
    "DataParallel": "a multi-device wrapper around a layer",
}


@dataclass(frozen=True)
class Layer:
    """A table entry: ``make()`` builds the layer (seeded), ``inputs()`` its example inputs."""

    name: str
    make: Callable[[], torch.nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]


def catalog() -> list[Layer]:
    """Every layer of the table, with simple arguments and small inputs."""
    import torch
    from torch import nn

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape)

    def p(*shape: int) -> torch.Tensor:  # probabilities in (0, 1)
        return torch.rand(*shape) * 0.8 + 0.1

    def ints(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape)

    def signs(*shape: int) -> torch.Tensor:
        return torch.randint(0, 2, shape).float() * 2 - 1

    def one(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
        return lambda: (r(*shape),)

    def unpool(dims: int) -> Callable[[], tuple[torch.Tensor, ...]]:
        pool = [nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d][dims - 1](2, return_indices=True)
        return lambda: tuple(pool(r(1, 2, *[4] * dims)))

    x1, x2, x3 = one(2, 3, 6), one(2, 3, 4, 4), one(1, 2, 4, 4, 4)
    layers = [
        Layer("Identity", nn.Identity, one(2, 3)),
        Layer("Linear", lambda: nn.Linear(4, 3), one(2, 4)),
        Layer("LazyLinear", lambda: nn.LazyLinear(3), one(2, 4)),
        Layer("Bilinear", lambda: nn.Bilinear(3, 4, 2), lambda: (r(2, 3), r(2, 4))),
        Layer("Conv1d", lambda: nn.Conv1d(3, 4, 3), x1),
        Layer("Conv2d", lambda: nn.Conv2d(3, 4, 3, padding=1), x2),
        Layer("Conv3d", lambda: nn.Conv3d(2, 3, 3), x3),
        Layer("LazyConv1d", lambda: nn.LazyConv1d(4, 3), x1),
        Layer("LazyConv2d", lambda: nn.LazyConv2d(4, 3), x2),
        Layer("LazyConv3d", lambda: nn.LazyConv3d(3, 3), x3),
        Layer("ConvTranspose1d", lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), x1),
        Layer("ConvTranspose2d", lambda: nn.ConvTranspose2d(3, 4, 3, stride=2), x2),
        Layer("ConvTranspose3d", lambda: nn.ConvTranspose3d(2, 3, 3), x3),
        Layer("LazyConvTranspose1d", lambda: nn.LazyConvTranspose1d(4, 3), x1),
        Layer("LazyConvTranspose2d", lambda: nn.LazyConvTranspose2d(4, 3), x2),
        Layer("LazyConvTranspose3d", lambda: nn.LazyConvTranspose3d(3, 3), x3),
        Layer("Fold", lambda: nn.Fold((4, 4), 2), one(1, 8, 9)),
        Layer("Unfold", lambda: nn.Unfold(2), x2),
        # pooling
        Layer("MaxPool1d", lambda: nn.MaxPool1d(2), x1),
        Layer("MaxPool2d", lambda: nn.MaxPool2d(2), x2),
        Layer("MaxPool3d", lambda: nn.MaxPool3d(2), x3),
        Layer("MaxUnpool1d", lambda: nn.MaxUnpool1d(2), unpool(1)),
        Layer("MaxUnpool2d", lambda: nn.MaxUnpool2d(2), unpool(2)),
        Layer("MaxUnpool3d", lambda: nn.MaxUnpool3d(2), unpool(3)),
        Layer("AvgPool1d", lambda: nn.AvgPool1d(2), x1),
        Layer("AvgPool2d", lambda: nn.AvgPool2d(2), x2),
        Layer("AvgPool3d", lambda: nn.AvgPool3d(2), x3),
        Layer("FractionalMaxPool2d", lambda: nn.FractionalMaxPool2d(2, output_size=2), x2),
        Layer("FractionalMaxPool3d", lambda: nn.FractionalMaxPool3d(2, output_size=2), x3),
        Layer("LPPool1d", lambda: nn.LPPool1d(2, 2), x1),
        Layer("LPPool2d", lambda: nn.LPPool2d(2, 2), x2),
        Layer("LPPool3d", lambda: nn.LPPool3d(2, 2), x3),
        Layer("AdaptiveMaxPool1d", lambda: nn.AdaptiveMaxPool1d(3), x1),
        Layer("AdaptiveMaxPool2d", lambda: nn.AdaptiveMaxPool2d(2), x2),
        Layer("AdaptiveMaxPool3d", lambda: nn.AdaptiveMaxPool3d(2), x3),
        Layer("AdaptiveAvgPool1d", lambda: nn.AdaptiveAvgPool1d(3), x1),
        Layer("AdaptiveAvgPool2d", lambda: nn.AdaptiveAvgPool2d(2), x2),
        Layer("AdaptiveAvgPool3d", lambda: nn.AdaptiveAvgPool3d(2), x3),
        Layer("AdaptiveAvgPool2d (global)", lambda: nn.AdaptiveAvgPool2d(1), x2),
        # padding
        *(
            Layer(f"{kind}Pad{d}d", lambda kind=kind, d=d, args=args: getattr(nn, f"{kind}Pad{d}d")(*args), x)
            for d, x in ((1, x1), (2, x2), (3, x3))
            for kind, args in (
                ("Constant", (1, 0.5)),
                ("Zero", (1,)),
                ("Reflection", (1,)),
                ("Replication", (1,)),
                ("Circular", (1,)),
            )
        ),
        # normalization
        Layer("BatchNorm1d", lambda: nn.BatchNorm1d(3), x1),
        Layer("BatchNorm2d", lambda: nn.BatchNorm2d(3), x2),
        Layer("BatchNorm3d", lambda: nn.BatchNorm3d(2), x3),
        Layer("LazyBatchNorm1d", nn.LazyBatchNorm1d, x1),
        Layer("LazyBatchNorm2d", nn.LazyBatchNorm2d, x2),
        Layer("LazyBatchNorm3d", nn.LazyBatchNorm3d, x3),
        Layer("SyncBatchNorm", lambda: nn.SyncBatchNorm(3), x2),
        Layer("InstanceNorm1d", lambda: nn.InstanceNorm1d(3, affine=True), x1),
        Layer("InstanceNorm2d", lambda: nn.InstanceNorm2d(3, affine=True), x2),
        Layer("InstanceNorm3d", lambda: nn.InstanceNorm3d(2, affine=True), x3),
        Layer("LazyInstanceNorm1d", lambda: nn.LazyInstanceNorm1d(affine=True), x1),
        Layer("LazyInstanceNorm2d", lambda: nn.LazyInstanceNorm2d(affine=True), x2),
        Layer("LazyInstanceNorm3d", lambda: nn.LazyInstanceNorm3d(affine=True), x3),
        Layer("LayerNorm", lambda: nn.LayerNorm(4), one(2, 3, 4)),
        Layer("GroupNorm", lambda: nn.GroupNorm(2, 4), one(2, 4, 3)),
        Layer("RMSNorm", lambda: nn.RMSNorm(4), one(2, 3, 4)),
        Layer("LocalResponseNorm", lambda: nn.LocalResponseNorm(2), x2),
        Layer("CrossMapLRN2d", lambda: nn.CrossMapLRN2d(3), x2),
        # activations
        *(
            Layer(name, getattr(nn, name), one(2, 3, 4))
            for name in (
                "ELU",
                "Hardshrink",
                "Hardsigmoid",
                "Hardtanh",
                "Hardswish",
                "LeakyReLU",
                "LogSigmoid",
                "PReLU",
                "ReLU",
                "ReLU6",
                "RReLU",
                "SELU",
                "CELU",
                "GELU",
                "Sigmoid",
                "SiLU",
                "Mish",
                "Softplus",
                "Softshrink",
                "Softsign",
                "Tanh",
                "Tanhshrink",
                "GLU",
            )
        ),
        Layer("GELU (tanh)", lambda: nn.GELU(approximate="tanh"), one(2, 3, 4)),
        Layer("Threshold", lambda: nn.Threshold(0.1, 20.0), one(2, 3, 4)),
        Layer("Softmin", lambda: nn.Softmin(dim=1), one(2, 3, 4)),
        Layer("Softmax", lambda: nn.Softmax(dim=1), one(2, 3, 4)),
        Layer("Softmax2d", nn.Softmax2d, x2),
        Layer("LogSoftmax", lambda: nn.LogSoftmax(dim=1), one(2, 3, 4)),
        Layer("MultiheadAttention", lambda: nn.MultiheadAttention(8, 2), lambda: (r(3, 2, 8), r(3, 2, 8), r(3, 2, 8))),
        Layer(
            "AdaptiveLogSoftmaxWithLoss",
            lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4]),
            lambda: (r(3, 8), torch.tensor([1, 5, 9])),
        ),
        # embeddings
        Layer("Embedding", lambda: nn.Embedding(10, 3), lambda: (ints(10, 2, 4),)),
        Layer("EmbeddingBag (mean)", lambda: nn.EmbeddingBag(10, 3), lambda: (ints(10, 2, 4),)),
        Layer("EmbeddingBag (sum)", lambda: nn.EmbeddingBag(10, 3, mode="sum"), lambda: (ints(10, 2, 4),)),
        Layer("EmbeddingBag (max)", lambda: nn.EmbeddingBag(10, 3, mode="max"), lambda: (ints(10, 2, 4),)),
        # recurrent
        Layer("RNN", lambda: nn.RNN(4, 3), one(5, 2, 4)),
        Layer("GRU", lambda: nn.GRU(4, 3), one(5, 2, 4)),
        Layer("LSTM", lambda: nn.LSTM(4, 3), one(5, 2, 4)),
        Layer("LSTM (2 layers, bidirectional)", lambda: nn.LSTM(4, 3, 2, bidirectional=True), one(5, 2, 4)),
        Layer("RNNCell", lambda: nn.RNNCell(4, 3), one(2, 4)),
        Layer("GRUCell", lambda: nn.GRUCell(4, 3), one(2, 4)),
        Layer("LSTMCell", lambda: nn.LSTMCell(4, 3), one(2, 4)),
        # transformers
        Layer("TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(8, 2, 16), one(3, 2, 8)),
        Layer(
            "TransformerDecoderLayer", lambda: nn.TransformerDecoderLayer(8, 2, 16), lambda: (r(4, 2, 8), r(3, 2, 8))
        ),
        Layer(
            "TransformerEncoder",
            lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2, enable_nested_tensor=False),
            one(3, 2, 8),
        ),
        Layer(
            "TransformerDecoder",
            lambda: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16), 2),
            lambda: (r(4, 2, 8), r(3, 2, 8)),
        ),
        Layer("Transformer", lambda: nn.Transformer(8, 2, 1, 1, 16), lambda: (r(3, 2, 8), r(4, 2, 8))),
        # resampling and reshaping
        Layer("Upsample (nearest)", lambda: nn.Upsample(scale_factor=2), x2),
        Layer("Upsample (linear)", lambda: nn.Upsample(scale_factor=2, mode="linear"), x1),
        Layer("Upsample (bilinear)", lambda: nn.Upsample(scale_factor=2, mode="bilinear"), x2),
        Layer("Upsample (bicubic)", lambda: nn.Upsample(scale_factor=2, mode="bicubic"), x2),
        Layer("Upsample (trilinear)", lambda: nn.Upsample(scale_factor=2, mode="trilinear"), x3),
        Layer("UpsamplingNearest2d", lambda: nn.UpsamplingNearest2d(scale_factor=2), x2),
        Layer("UpsamplingBilinear2d", lambda: nn.UpsamplingBilinear2d(scale_factor=2), x2),
        Layer("PixelShuffle", lambda: nn.PixelShuffle(2), one(1, 8, 2, 2)),
        Layer("PixelUnshuffle", lambda: nn.PixelUnshuffle(2), x2),
        Layer("ChannelShuffle", lambda: nn.ChannelShuffle(2), one(1, 4, 2, 2)),
        Layer("Flatten", nn.Flatten, one(2, 3, 4)),
        Layer("Unflatten", lambda: nn.Unflatten(1, (2, 2)), one(2, 4, 3)),
        # dropout (training mode)
        Layer("Dropout", nn.Dropout, one(2, 3, 4)),
        Layer("Dropout1d", nn.Dropout1d, x1),
        Layer("Dropout2d", nn.Dropout2d, x2),
        Layer("Dropout3d", nn.Dropout3d, x3),
        Layer("AlphaDropout", nn.AlphaDropout, one(2, 3, 4)),
        Layer("FeatureAlphaDropout", nn.FeatureAlphaDropout, x2),
        # distances
        Layer("CosineSimilarity", nn.CosineSimilarity, lambda: (r(3, 4), r(3, 4))),
        Layer("PairwiseDistance", nn.PairwiseDistance, lambda: (r(3, 4), r(3, 4))),
        # losses
        *(
            Layer(name, getattr(nn, name), lambda: (r(3, 4), r(3, 4)))
            for name in ("L1Loss", "MSELoss", "HuberLoss", "SmoothL1Loss")
        ),
        Layer("CrossEntropyLoss", nn.CrossEntropyLoss, lambda: (r(3, 5), ints(5, 3))),
        Layer("CrossEntropyLoss (probabilities)", nn.CrossEntropyLoss, lambda: (r(3, 5), torch.softmax(r(3, 5), 1))),
        Layer("NLLLoss", nn.NLLLoss, lambda: (torch.log_softmax(r(3, 5), 1), ints(5, 3))),
        Layer("NLLLoss2d", nn.NLLLoss2d, lambda: (torch.log_softmax(r(2, 3, 4, 4), 1), ints(3, 2, 4, 4))),
        Layer("LinearCrossEntropyLoss", lambda: nn.LinearCrossEntropyLoss(4, 5), lambda: (r(3, 4), ints(5, 3))),
        Layer("PoissonNLLLoss", nn.PoissonNLLLoss, lambda: (r(3, 4), p(3, 4) * 3)),
        Layer("GaussianNLLLoss", nn.GaussianNLLLoss, lambda: (r(3, 4), r(3, 4), p(3, 4))),
        Layer(
            "KLDivLoss",
            lambda: nn.KLDivLoss(reduction="batchmean"),
            lambda: (torch.log_softmax(r(3, 4), 1), torch.softmax(r(3, 4), 1)),
        ),
        Layer("BCELoss", nn.BCELoss, lambda: (p(3, 4), p(3, 4))),
        Layer("BCEWithLogitsLoss", nn.BCEWithLogitsLoss, lambda: (r(3, 4), p(3, 4))),
        Layer("MarginRankingLoss", nn.MarginRankingLoss, lambda: (r(3), r(3), signs(3))),
        Layer("HingeEmbeddingLoss", nn.HingeEmbeddingLoss, lambda: (r(3, 4), signs(3, 4))),
        Layer(
            "MultiLabelMarginLoss",
            nn.MultiLabelMarginLoss,
            lambda: (r(2, 4), torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]])),
        ),
        Layer("SoftMarginLoss", nn.SoftMarginLoss, lambda: (r(3, 4), signs(3, 4))),
        Layer("MultiLabelSoftMarginLoss", nn.MultiLabelSoftMarginLoss, lambda: (r(3, 4), (signs(3, 4) + 1) / 2)),
        Layer("CosineEmbeddingLoss", nn.CosineEmbeddingLoss, lambda: (r(3, 4), r(3, 4), signs(3))),
        Layer("MultiMarginLoss", nn.MultiMarginLoss, lambda: (r(3, 5), ints(5, 3))),
        Layer("TripletMarginLoss", nn.TripletMarginLoss, lambda: (r(3, 4), r(3, 4), r(3, 4))),
        Layer("TripletMarginWithDistanceLoss", nn.TripletMarginWithDistanceLoss, lambda: (r(3, 4), r(3, 4), r(3, 4))),
        Layer(
            "CTCLoss",
            nn.CTCLoss,
            lambda: (
                torch.log_softmax(r(6, 2, 4), 2),
                torch.tensor([[1, 2, 3], [3, 1, 0]]),
                torch.tensor([6, 6]),
                torch.tensor([3, 2]),
            ),
        ),
    ]
    return layers


def export(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> onnx.ModelProto:
    """``module(*inputs)`` exported by the TorchScript exporter in training mode, parameters as initializers.

    The layer is called from a wrapper that takes only the inputs: the exporter would otherwise turn the
    defaults of the layer's other arguments (``is_causal=False``, ``output_size=None``) into inputs.
    """
    import torch

    class Call(torch.nn.Module):
        def __init__(self, layer: torch.nn.Module) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, *args: torch.Tensor) -> Any:
            return self.layer(*args)

    module = Call(module)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), _silenced_stdout():  # the exporter prints its graph when it fails
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            tuple(inputs),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=[f"input{k}" for k in range(len(inputs))],
        )
    return onnx.load_from_string(buffer.getvalue())


@contextlib.contextmanager
def _silenced_stdout() -> Iterator[None]:
    """File descriptor 1 sent to the null device (torch's C++ code prints there, past ``sys.stdout``)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def layer_row(layer: Layer) -> LayerRow:
    """Export ``layer`` and check that it trains (parameters and float inputs differentiated)."""
    import torch

    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():  # deprecations (NLLLoss2d) and performance hints (Transformer)
            warnings.simplefilter("ignore")
            module = layer.make().train()
            inputs = layer.inputs()
            module(*inputs)  # materializes lazy layers, and checks the example
        model = export(module, inputs)
    except Exception as error:  # the export's failure is the answer for this layer
        return LayerRow(layer.name, None, f"{type(error).__name__}: {str(error).strip().splitlines()[0]}")
    graph_inputs = {value.name for value in model.graph.input}
    feeds = {f"input{k}": t.numpy() for k, t in enumerate(inputs) if f"input{k}" in graph_inputs}
    float_inputs = [name for name, value in feeds.items() if value.dtype.kind == "f"]
    found = trainable_parameters(model)
    misread = _misread_parameters(module, model, found)
    if misread:
        return LayerRow(layer.name, TrainingCheck(model_operators(model), error=misread))
    return LayerRow(layer.name, check_training(model, [*found, *float_inputs], feeds))


def _misread_parameters(module: torch.nn.Module, model: onnx.ModelProto, found: Sequence[str]) -> str:
    """Where :func:`~onnxtrain.artifacts.trainable_parameters` of ``model`` is not the layer's parameters
    (those the export stores as initializers), what it misses and what it adds; ``""`` where it is."""
    stored = {t.name for t in model.graph.initializer}
    parameters = {f"layer.{name}" for name, _ in module.named_parameters()} & stored
    missed, added = sorted(parameters - set(found)), sorted(set(found) - parameters)
    if not missed and not added:
        return ""
    return f"trainable_parameters misses {missed} and adds {added}"


def check_catalog(layers: Sequence[Layer]) -> None:
    """Every public torch.nn module class is in the catalog or in :data:`EXCLUDED`; ``ValueError`` naming the others."""
    import inspect

    from torch import nn

    public = {
        name for name in dir(nn) if inspect.isclass(getattr(nn, name)) and issubclass(getattr(nn, name), nn.Module)
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        listed = {type(layer.make()).__name__ for layer in layers}
    missing = sorted(public - listed - set(EXCLUDED))
    if missing:
        raise ValueError(
            f"torch.nn classes neither in the catalog nor in EXCLUDED: {missing}; add them to "
            "tools/gradient_coverage.py"
        )


def torch_section(layers: Sequence[Layer] | None = None) -> str:
    """The torch.nn section of the document (every layer of :func:`catalog` unless ``layers``)."""
    import onnxruntime
    import torch

    layers = catalog() if layers is None else layers
    source = (
        f"torch {torch.__version__.split('+')[0]} (TorchScript exporter, training mode, opset {OPSET}), "
        f"onnx {onnx.__version__} and onnxruntime {onnxruntime.__version__}"
    )
    return layers_markdown([layer_row(layer) for layer in layers], source, EXCLUDED)


def document(layers: str) -> str:
    """The whole document: the registry part, the torch.nn section ``layers`` (may be empty), then which rules
    are closed under differentiation (from the specs of tests/autodiff)."""
    from tests.autodiff.closure import closure_markdown, closure_rows, rule_spec_faults
    from tests.autodiff.test_rules import SPECS

    second_order = closure_markdown(closure_rows(SPECS, rule_spec_faults(workers=min(2, os.cpu_count() or 1))))
    return coverage_markdown() + ("\n" + layers if layers else "") + "\n" + second_order


def main(argv: Sequence[str] | None = None) -> int:
    """Write :data:`DOCUMENT` (or print it with ``--stdout``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: keeping the committed torch.nn section", file=sys.stderr)
        _, layers = split_document(DOCUMENT.read_text()) if DOCUMENT.exists() else ("", "")
    else:
        layers_list = catalog()
        check_catalog(layers_list)
        layers = torch_section(layers_list)
    text = document(layers)
    if "--stdout" in args:
        print(text, end="")
    else:
        DOCUMENT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
