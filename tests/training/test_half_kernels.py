"""float16 nodes onnxruntime runs in float32 itself: said, as bfloat16's fallback is (onnxtrain.training.half_kernels).

onnxruntime's CPU provider (x86-64) has no float16 ``MatMul``, ``Gemm``,
``Add`` or ``Relu`` kernel. A float16 session does not fail: onnxruntime casts
around those nodes and removes the casts that meet, so float16 artifacts on
the CPU compute in float32, their values rounded to float16 only where a node
with a float16 kernel (a ``Transpose`` of the backward) keeps them in it (a
user measured a CLIP model's gradients equal to float32's, bit for bit). The
runtime says so, naming the operators, once per module.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from onnxtrain import api
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.optim.loss_scaling import LOSS_SCALE
from onnxtrain.training.half_kernels import HalfPrecisionFallbackWarning, float32_in_onnxruntime
from tests.helpers import FLOAT, make_model
from tests.training import models

CPU = ["CPUExecutionProvider"]
SAID = "in float16, which this execution provider has no float16 kernel for"


def _half_chain(half: int = onnx.TensorProto.FLOAT16) -> onnx.ModelProto:
    """``Cast(a, half) -> MatMul -> Transpose -> Cast(float)``: a product and a node with a float16 kernel."""
    nodes = [
        helper.make_node("Cast", ["a"], ["ah"], to=half),
        helper.make_node("MatMul", ["ah", "ah"], ["m"]),
        helper.make_node("Transpose", ["m"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["y"], to=FLOAT),
    ]
    return make_model({"a": (FLOAT, [4, 4])}, nodes, {"y": (FLOAT, [4, 4])})


def _cpu_float16_kernel(op_type: str) -> bool:
    """Whether onnxruntime's CPU provider registers a float16 kernel for ``op_type`` (some ARM64 builds do for
    the products)."""
    return any(
        kernel.op_name == op_type and kernel.provider == CPU[0] and "tensor(float16)" in str(kernel.type_constraints)
        for kernel in ort_state.get_all_opkernel_def()
    )


needs_no_float16_matmul = pytest.mark.skipif(
    _cpu_float16_kernel("MatMul"), reason="this onnxruntime's CPU provider has a float16 MatMul"
)


@needs_no_float16_matmul
def test_the_products_without_a_float16_kernel_are_found() -> None:
    assert float32_in_onnxruntime(_half_chain(), CPU) == ["MatMul"]  # Transpose has one; Cast is the cast


@pytest.mark.parametrize(
    ("model", "providers"),
    [
        (_half_chain(onnx.TensorProto.BFLOAT16), CPU),  # bfloat16: the session fails instead (widened, said)
        (models.mlp(), CPU),  # float32
        (_half_chain(), ["AProviderThatCompilesTheGraph"]),  # lists no kernels: cannot tell
        (_half_chain(), None),  # not a session
    ],
    ids=["bf16", "fp32", "compiling_provider", "no_providers"],
)
def test_nothing_is_found_where_onnxruntime_casts_nothing_or_it_cannot_be_told(
    model: onnx.ModelProto, providers: list[str] | None
) -> None:
    assert float32_in_onnxruntime(model, providers) == []


def _one_step(paths: dict[str, Path], x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray], list]:
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = api.Module(paths["training_model"], state, paths["eval_model"])
        optimizer = api.Optimizer(paths["optimizer_model"], module)
        loss = float(module(x, y))
        optimizer.step()
        module.lazy_reset_grad()
        float(module(x, y))
        module.eval()(x, y)
    scale = float(state.parameters[LOSS_SCALE].data[0]) if LOSS_SCALE in state.parameters.names() else 1.0
    grads = {name: state.parameters[name].grad / scale for name in ("fc0.weight", "fc1.weight")}
    return loss, grads, [w for w in caught if w.category is HalfPrecisionFallbackWarning]


@needs_no_float16_matmul
def test_float16_artifacts_on_the_cpu_say_they_compute_in_float32_and_do(tmp_path: Path) -> None:
    """The MLP's float16 artifacts: one warning for all the module's sessions, naming the product. The loss is
    float32 artifacts', bit for bit (the forward's casts all meet and go); the gradients (divided by the loss
    scale, a power of two) are within float16's rounding of the activations a Transpose of the backward keeps
    in float16, as docs/artifacts.md ("Where a kernel is missing") says of onnxruntime's CPU provider."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int64)
    runs = {}
    for precision in ("fp32", "fp16"):
        paths = models.generate(tmp_path / precision, models.mlp(), loss=LossType.CrossEntropyLoss,
                                optimizer=OptimType.SGD, precision=precision)  # fmt: skip
        runs[precision] = _one_step(paths, x, y)
    (loss32, grads32, said32), (loss16, grads16, said16) = runs["fp32"], runs["fp16"]
    assert said32 == []
    assert len(said16) == 1, [str(w.message) for w in said16]
    message = str(said16[0].message)
    assert SAID in message and "MatMul" in message and "precision='fp32'" in message
    assert loss16 == loss32
    for name, grad in grads32.items():
        np.testing.assert_allclose(grads16[name], grad, rtol=0, atol=2e-3 * np.abs(grad).max(), err_msg=name)
