"""Static batch sizes: no constant in a gradient graph grows with them, and building allocates nothing of their size.

The whole-model test models (symbolic batch ``batch``) get a static batch of
10**7 or 10**12 and their training models are built, not run: each builds
quickly under a cap on the address space, and its constants stay within
:data:`~onnxtrain.autodiff.dims.SMALL_CONSTANT_LIMIT` elements. Above that
limit the dimension-sized tensors of the rules are made at run time
(:mod:`onnxtrain.autodiff.dims`); the finite-difference checks of the rules
that use them run again with a limit of 0, so that every such tensor takes
the run-time form, and one model runs with a batch past the limit.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
import tracemalloc
from collections.abc import Iterator
from unittest import mock

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from onnxtrain.autodiff import dims
from tests.autodiff import models
from tests.autodiff.gradcheck import DIM_MODES, build, check, excuse_forward_fault
from tests.autodiff.test_rules import SPECS

#: Extra address space a build may take (a batch-sized allocation at 10**12 is terabytes).
ADDRESS_SPACE_SLACK = 2 * 2**30
#: Python allocations a build may peak at.
PYTHON_PEAK = 64 * 2**20
#: The serialized training model: a few kB for these models, whatever the batch.
MODEL_BYTES = 32 * 1024
#: Seconds a build may take on a slow CI machine (about 0.2 s each here).
SECONDS = 10.0

#: The rules that make dimension-sized tensors with onnxtrain.autodiff.dims.
SIZED_OPS = frozenset(
    {
        "Add",  # un-broadcasting: ones to sum the leading axes with
        "Gemm",
        "MatMul",
        "Einsum",  # the Kronecker delta of a repeated letter
        "Det",  # minor indices and signs
        "DFT",  # inverse one-sided weights
        "NegativeLogLikelihoodLoss",  # class indices
        "SoftmaxCrossEntropyLoss",
        "AveragePool",  # ones kernels
        "LpPool",
        "LRN",
        "Col2Im",  # one-hot kernel
        "RoiAlign",  # positions
        "MaxRoiPool",
        "Attention",
    }
)
SIZED_SPECS = [spec for spec in SPECS if spec.op_type in SIZED_OPS]


def with_static_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy of ``model`` whose symbolic ``batch`` dimensions are ``batch``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in [*copy.graph.input, *copy.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "batch":
                dim.dim_value = batch
    return copy


def largest_constant(model: onnx.ModelProto) -> int:
    """The most elements of an initializer or of a Constant node's tensor."""
    sizes = [int(np.prod(t.dims, dtype=np.int64)) for t in model.graph.initializer]
    for node in model.graph.node:
        sizes += [
            int(np.prod(a.t.dims, dtype=np.int64)) for a in node.attribute if a.type == onnx.AttributeProto.TENSOR
        ]
    return max(sizes, default=0)


@contextlib.contextmanager
def address_space_cap(extra: int) -> Iterator[None]:
    """Allocations beyond ``extra`` more bytes of address space fail (``MemoryError``) instead of
    exhausting the machine; Linux only (elsewhere, nothing)."""
    try:
        with open("/proc/self/status") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = kib * 1024 + extra
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.skipif(sys.platform != "linux", reason="the address-space cap is Linux's")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("batch", [10**7, 10**12], ids=["1e7", "1e12"])
@pytest.mark.parametrize("name", models.NAMES)
def test_a_static_batch_builds_a_small_training_model(name, batch, dtype):
    case = models.build(name, dtype)
    model = with_static_batch(case.model, batch)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with address_space_cap(ADDRESS_SPACE_SLACK):
            block = models.training_block(model, case.loss, case.trainable, case.frozen)
            training = block.gradient_models.training
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < SECONDS, f"took {elapsed:.1f} s"
    assert peak < PYTHON_PEAK, f"Python allocations peaked at {peak} bytes"
    assert len(training.SerializeToString()) < MODEL_BYTES
    assert largest_constant(training) <= dims.SMALL_CONSTANT_LIMIT
    declared = [d.dim_value for v in training.graph.input for d in v.type.tensor_type.shape.dim]
    assert batch in declared  # the batch stayed static


def test_a_batch_past_the_limit_sums_with_ones_made_at_run_time():
    """``relu_mlp`` with a static batch of 5000 (> 4096): its bias gradients are a MatMul with ones of
    ``ConstantOfShape``, and the gradients are those of the same model with a symbolic batch."""
    batch = 5000
    assert batch > dims.SMALL_CONSTANT_LIMIT
    case = models.build("relu_mlp", np.float32)
    static_block = models.training_block(with_static_batch(case.model, batch), case.loss, case.trainable)
    static = static_block.gradient_models.training
    symbolic = models.training_block(case.model, case.loss, case.trainable).gradient_models.training
    assert largest_constant(static) <= dims.SMALL_CONSTANT_LIMIT
    ones = {node.output[0] for node in static.graph.node if node.op_type == "ConstantOfShape"}
    assert any(node.op_type == "MatMul" and node.input[0] in ones for node in static.graph.node)
    feeds = {**case.data(np.random.default_rng(0), batch), **case.params}
    got, expected = models.Runner(static)(feeds), models.Runner(symbolic)(feeds)
    assert got.keys() == expected.keys()
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=2e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("spec", SIZED_SPECS, ids=[spec.id for spec in SIZED_SPECS])
@settings(max_examples=6)
@given(data=st.data())
def test_run_time_forms_match_finite_differences(spec, data):
    """The rules' gradients with every dimension-sized tensor made at run time (a limit of 0)."""
    case = data.draw(spec.cases, label="case")
    modes = getattr(spec, "dim_modes", DIM_MODES)
    assume("static" in modes)  # the run-time forms replace constants of static sizes
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    try:
        with mock.patch.object(dims, "SMALL_CONSTANT_LIMIT", 0):
            compiled = build(spec, case, "static")
        result = check(spec, case, "static", seed, compiled)
    except Exception:
        excuse_forward_fault(spec, case, "static", seed)  # an older release's kernel for the operator itself
        raise
    assume(result is not None)
    assert result is not None
    if not result.ok:
        excuse_forward_fault(spec, case, "static", seed)
    assert result.ok, (
        f"{spec.id}: <t, grad> = {result.analytic!r}, finite difference = {result.numeric!r} "
        f"(tolerance {result.tolerance:.3g})"
    )
