"""Bad hyper-parameters and bad parameter lists: errors that name the problem and the valid choices."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain.optim import SGD, Adagrad, Adam, AdamW, ClipGradNorm, ClipGradValue, Optimizer, RMSprop
from tests.optim.runner import tensors

NAN, INF = math.nan, math.inf

#: (constructor, keyword arguments, text the message must contain: the argument, then the valid range).
BAD_VALUES: list[tuple[Callable[..., Any], dict[str, Any], str, str]] = [
    (SGD, {"momentum": -0.1}, "momentum", ">= 0"),
    (SGD, {"momentum": INF}, "momentum", "finite"),
    (SGD, {"dampening": 1.5}, "dampening", "[0, 1]"),
    (SGD, {"dampening": -0.5}, "dampening", "[0, 1]"),
    (SGD, {"weight_decay": -1e-3}, "weight_decay", ">= 0"),
    (SGD, {"weight_decay": NAN}, "weight_decay", ">= 0"),
    (SGD, {"nesterov": True}, "nesterov", "momentum > 0"),
    (SGD, {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "nesterov", "dampening = 0"),
    (Adam, {"betas": (1.0, 0.999)}, "betas[0]", "[0, 1)"),
    (Adam, {"betas": (0.9, -0.1)}, "betas[1]", "[0, 1)"),
    (Adam, {"betas": (0.9,)}, "betas", "pair"),
    (Adam, {"eps": -1e-8}, "eps", ">= 0"),
    (Adam, {"weight_decay": -0.1}, "weight_decay", ">= 0"),
    (AdamW, {"betas": (0.9, 1.0)}, "betas[1]", "[0, 1)"),
    (AdamW, {"eps": NAN}, "eps", ">= 0"),
    (AdamW, {"weight_decay": INF}, "weight_decay", "finite"),
    (Adagrad, {"lr_decay": -0.1}, "lr_decay", ">= 0"),
    (Adagrad, {"weight_decay": -0.1}, "weight_decay", ">= 0"),
    (Adagrad, {"initial_accumulator_value": -1.0}, "initial_accumulator_value", ">= 0"),
    (Adagrad, {"eps": -1.0}, "eps", ">= 0"),
    (RMSprop, {"alpha": 1.5}, "alpha", "[0, 1]"),
    (RMSprop, {"eps": -1.0}, "eps", ">= 0"),
    (RMSprop, {"momentum": -0.9}, "momentum", ">= 0"),
    (RMSprop, {"weight_decay": -0.1}, "weight_decay", ">= 0"),
    (ClipGradNorm, {"max_norm": 0.0}, "max_norm", "> 0"),
    (ClipGradNorm, {"max_norm": -1.0}, "max_norm", "> 0"),
    (ClipGradNorm, {"max_norm": NAN}, "max_norm", "> 0"),
    (ClipGradNorm, {"max_norm": 1.0, "norm_type": 0.0}, "norm_type", "> 0"),
    (ClipGradNorm, {"max_norm": 1.0, "norm_type": -2.0}, "norm_type", "> 0"),
    (ClipGradNorm, {"max_norm": 1.0, "norm_type": NAN}, "norm_type", "> 0"),
    (ClipGradValue, {"clip_value": 0.0}, "clip_value", "> 0"),
    (ClipGradValue, {"clip_value": NAN}, "clip_value", "> 0"),
]


@pytest.mark.parametrize(
    ("make", "kwargs", "argument", "valid"), BAD_VALUES, ids=[f"{c.__name__}-{k}" for c, k, _, _ in BAD_VALUES]
)
def test_bad_hyperparameter_values(make: Callable[..., Any], kwargs: dict[str, Any], argument: str, valid: str) -> None:
    with pytest.raises(ValueError, match=re.escape(argument)) as error:
        make(**kwargs)
    assert valid in str(error.value)
    assert make.__name__ in str(error.value)


@pytest.mark.parametrize(
    ("make", "kwargs", "argument"),
    [
        (SGD, {"momentum": "0.9"}, "momentum"),
        (SGD, {"nesterov": 1}, "nesterov"),
        (Adam, {"betas": 0.9}, "betas"),
        (Adam, {"amsgrad": "yes"}, "amsgrad"),
        (AdamW, {"bias_correction": None}, "bias_correction"),
        (RMSprop, {"centered": 0}, "centered"),
        (Adagrad, {"eps": True}, "eps"),
        (SGD, {"clip_grad": 1.0}, "clip_grad"),
        (AdamW, {"clip_grad": "norm"}, "clip_grad"),
        (AdamW, {"no_decay": [""]}, "no_decay"),
        (SGD, {"no_decay": ["bias", 3]}, "no_decay"),
        (Adam, {"no_decay": {"bias"}}, "no_decay"),
    ],
)
def test_hyperparameters_of_the_wrong_type(make: Callable[..., Any], kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(TypeError, match=re.escape(argument)):
        make(**kwargs)


def test_a_value_of_the_wrong_type_says_the_range() -> None:
    with pytest.raises(TypeError, match=r"ClipGradNorm: max_norm must be a number > 0 \(inf: never clip\) \(a real "):
        ClipGradNorm("1.0")  # type: ignore[arg-type]


def test_valid_edge_values() -> None:
    SGD(momentum=0.0, dampening=1.0)
    Adam(betas=(0.0, 0.0), eps=0.0)
    Adam(betas=np.array([0.5, 0.5]))
    RMSprop(alpha=0.0)
    RMSprop(alpha=1.0)
    assert ClipGradNorm(INF).max_norm == INF
    assert SGD(momentum=np.float32(0.5)).hyperparameters()["momentum"] == 0.5


def _params(**arrays: np.ndarray) -> list[onnx.TensorProto]:
    return tensors(arrays)


@pytest.mark.parametrize("make", [SGD, Adam, AdamW, Adagrad, RMSprop])
def test_no_trainable_parameters(make: Callable[[], Optimizer]) -> None:
    optimizer = make()
    with onnxblock.empty_base() as builder:
        with pytest.raises(ValueError, match="no trainable parameters") as error:
            optimizer(([], _params(frozen=np.zeros(2, np.float32))))
        assert "requires_grad" in str(error.value)
        assert len(builder.model.graph.input) == 0 and len(builder.model.graph.node) == 0  # rolled back


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ((_params(w=np.zeros(2, np.float32), v=np.zeros(2, np.int64)), []), "'v' has element type int64"),
        ((_params(w=np.zeros(2, np.float32)) * 2, []), "'w' is listed twice"),
        ((_params(w=np.zeros(2, np.float32), w_grad=np.zeros(2, np.float32)), []), "'w_grad'"),
        ((_params(learning_rate=np.zeros(1, np.float32)), []), "'learning_rate'"),
        ((_params(**{"w.momentum0": np.zeros(1, np.float32), "w": np.zeros(1, np.float32)}), []), "'w.momentum0'"),
    ],
    ids=["integer", "duplicate", "clash-grad", "clash-lr", "clash-state"],
)
def test_bad_parameters(parameters: Any, message: str) -> None:
    with onnxblock.empty_base(), pytest.raises(ValueError, match=re.escape(message)):
        Adam()(parameters)


def test_parameters_of_the_wrong_kind() -> None:
    with onnxblock.empty_base(), pytest.raises(TypeError, match="TensorProto"):
        SGD()(([np.zeros(2)], []))
    with onnxblock.empty_base(), pytest.raises(TypeError, match="trainable, frozen"):
        SGD()("w")


def test_base_model_that_already_has_the_names() -> None:
    model = helper.make_model(
        helper.make_graph([], "g", [helper.make_tensor_value_info("w_grad", onnx.TensorProto.FLOAT, [2])], []),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    with onnxblock.base(model), pytest.raises(ValueError, match="empty_base"):
        SGD()(_params(w=np.zeros(2, np.float32)))


def test_model_before_build() -> None:
    with pytest.raises(RuntimeError, match="has not been built"):
        AdamW().to_model_proto()


def test_outside_a_base_context() -> None:
    with pytest.raises(ValueError, match="empty_base"):
        AdamW()(_params(w=np.zeros(2, np.float32)))


def test_no_decay_has_no_counterpart_in_onnx_runtimes_on_device_optimizer() -> None:
    """ONNX Runtime's ``AdamWOptimizer`` has one ``weight_decay`` for all parameters; without weight decay the
    patterns change nothing, and the target takes the optimizer."""
    from onnxtrain.optim.ort_nodes import ADAMW_NODE, ort_node

    with pytest.raises(ValueError, match=r"no_decay.*one weight_decay for all.*target='onnxruntime'"):
        ort_node(AdamW(weight_decay=0.01, no_decay=["bias"]))
    assert ort_node(AdamW(no_decay=["bias"])) is ADAMW_NODE
    assert AdamW(weight_decay=0.01, no_decay="bias").no_decay == ("bias",)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SGD(0.01), "SGD takes no learning rate.*set_learning_rate"),
        (lambda: AdamW(lr=1e-3), "AdamW takes no learning rate"),
        (lambda: AdamW(1e-3), "AdamW takes no learning rate"),  # ONNX Runtime's order: bias_correction first
        (lambda: Adagrad(learning_rate=0.1), "Adagrad takes no learning rate"),
        (lambda: Adam(iter([np.zeros(2)])), "Adam takes no parameters.*requires_grad"),
        (lambda: RMSprop(params=[np.zeros(2)]), "RMSprop takes no parameters"),
        (lambda: Adam((0.9, 0.99)), r"Adam's hyper-parameters are keyword arguments.*\(betas, eps"),
        (lambda: SGD(True), r"SGD's hyper-parameters are keyword arguments"),
    ],
)
def test_torch_optim_habits_are_refused_with_what_to_do(make: Callable[[], Any], message: str) -> None:
    """torch.optim's constructors take the parameters and the rate first, and an order of their own: a float
    given positionally would silently be another hyper-parameter (``SGD(0.01)``: a momentum of 0.01)."""
    with pytest.raises(TypeError, match=message):
        make()
    assert AdamW(True, (0.9, 0.99), 1e-8, 0.01).hyperparameters()["eps"] == 1e-8  # ONNX Runtime's positional order


def test_no_decay_pattern_that_matches_no_parameter_warns() -> None:
    """Hugging Face's list tests substrings (``"LayerNorm" in name``); these patterns are globs on a whole name
    or its part after a dot, so ``"LayerNorm"`` matches no ``encoder.LayerNorm.weight`` and decay would apply."""
    from onnxtrain.optim import UnmatchedPatternWarning

    trainable = tensors({"encoder.LayerNorm.weight": np.ones(2, np.float32), "fc.bias": np.ones(2, np.float32)})
    frozen = tensors({"embed.layer_norm.weight": np.ones(2, np.float32)})
    warned = r"'LayerNorm' matches none of the 3 parameters.*'LayerNorm\.\*'"
    with pytest.warns(UnmatchedPatternWarning, match=warned), onnxblock.empty_base():
        AdamW(weight_decay=0.1, no_decay=["bias", "LayerNorm", "layer_norm.weight"])((trainable, frozen))
    with warnings.catch_warnings():  # a pattern matching a frozen parameter only is no typo: no warning
        warnings.simplefilter("error", UnmatchedPatternWarning)
        with onnxblock.empty_base():
            AdamW(weight_decay=0.1, no_decay=["bias", "LayerNorm.*", "layer_norm.weight"])((trainable, frozen))
