"""The build context: ``base`` / ``empty_base`` backed by a ContextVar."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from onnxtrain.graph import GraphBuilder, NoBaseModelError, current_builder
from tests.helpers import FLOAT, identity_model, run_model


def _model(name: str = "x") -> onnx.ModelProto:
    return identity_model({name: (FLOAT, ["batch", 2])})


def _no_context() -> bool:
    try:
        current_builder()
    except NoBaseModelError:
        return True
    return False


def test_base_yields_builder_and_blocks_add_to_it() -> None:
    """Inside ``base``, blocks append to the yielded builder's model."""
    with onnxblock.base(_model()) as b:
        assert isinstance(b, GraphBuilder)
        assert current_builder() is b
        out = blocks.Relu()("x")
        assert b.model.graph.node[-1].op_type == "Relu"
        assert b.model.graph.node[-1].output[0] == out
    assert _no_context()


def test_nesting_inner_wins_outer_restored() -> None:
    """The inner context is current until it ends; then the outer one is again."""
    with onnxblock.base(_model("a")) as outer:
        with onnxblock.empty_base() as inner:
            assert current_builder() is inner
            blocks.Constant(1.0)()
            with onnxblock.base(_model("c")) as innermost:
                assert current_builder() is innermost
                blocks.Neg()("c")
            assert current_builder() is inner
        assert current_builder() is outer
        out = blocks.Neg()("a")
        assert [n.op_type for n in outer.model.graph.node] == ["Identity", "Neg"]
        assert len(inner.model.graph.node) == 0 and len(inner.model.graph.initializer) == 1
        assert [n.op_type for n in innermost.model.graph.node] == ["Identity", "Neg"]
        assert outer.has(out) and not inner.has(out)
    assert _no_context()


def test_reset_after_exception() -> None:
    """An exception inside the with-block resets the context (also when nested)."""
    with pytest.raises(RuntimeError, match="boom"), onnxblock.base(_model()):
        raise RuntimeError("boom")
    assert _no_context()
    with onnxblock.base(_model("a")) as outer:
        with pytest.raises(KeyError), onnxblock.empty_base():
            raise KeyError("inner")
        assert current_builder() is outer
    assert _no_context()


def test_block_outside_context_raises() -> None:
    """A block called outside any context: NoBaseModelError, a ValueError, saying what to do."""
    assert issubclass(NoBaseModelError, ValueError)
    with pytest.raises(NoBaseModelError, match=r"with onnxblock\.base\(model\)") as info:
        blocks.Relu()("x")
    assert "Relu" in str(info.value)
    with pytest.raises(ValueError, match=r"with onnxblock\.base\(model\)"):
        blocks.Constant(1.0)()


def test_context_after_the_with_block_is_gone() -> None:
    """A builder kept from a finished context is not current any more."""
    with onnxblock.base(_model()):
        pass
    with pytest.raises(NoBaseModelError):
        blocks.Abs()("x")


def test_threads_are_independent() -> None:
    """Two threads each build on their own base; neither sees the other's context."""
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def work(tag: str, scale: float) -> None:
        try:
            with onnxblock.base(_model()) as b:
                barrier.wait(timeout=30)  # both contexts are active now
                assert current_builder() is b
                c = blocks.Constant(np.float32(scale))()
                barrier.wait(timeout=30)
                out = blocks.Mul()("x", c)
                assert current_builder() is b
                barrier.wait(timeout=30)
                b.set_outputs([out])
                results[tag] = b.finalize()
            results[tag + "_after"] = _no_context()
        except BaseException as error:  # surfaced in the main thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(tag, s)) for tag, s in (("two", 2.0), ("three", 3.0))]
    with onnxblock.empty_base() as main_builder:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert current_builder() is main_builder  # untouched by the threads
        assert len(main_builder.model.graph.node) == 0
    assert not errors, errors
    x = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)
    for tag, scale in (("two", 2.0), ("three", 3.0)):
        model = results[tag]
        assert isinstance(model, onnx.ModelProto)
        assert [n.op_type for n in model.graph.node] == ["Identity", "Mul"]
        np.testing.assert_allclose(run_model(model, {"x": x})[0], x * scale, rtol=1e-6)
        assert results[tag + "_after"] is True


def test_new_thread_does_not_inherit_context() -> None:
    """A thread started inside a context has no base model of its own."""
    seen: list[bool] = []
    with onnxblock.empty_base():
        thread = threading.Thread(target=lambda: seen.append(_no_context()))
        thread.start()
        thread.join(timeout=30)
    assert seen == [True]
