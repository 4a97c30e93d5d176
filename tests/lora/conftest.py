"""Fixtures of the LoRA tests: the GPT-2-style model (torch, exported once per session) and its bases."""

from __future__ import annotations

from typing import Any

import onnx
import pytest

from tests.lora.helpers import Base, BaseKind, make_base
from tests.lora.models import export, tiny_gpt

#: Batch size of the exported model (the toy task's number of sequences).
BATCH = 4


@pytest.fixture(scope="session")
def gpt() -> tuple[Any, onnx.ModelProto]:
    """The torch module (seeded) and its export for ``input_ids: int64[BATCH, SEQ]``."""
    pytest.importorskip("torch")
    module = tiny_gpt(seed=0)
    return module, export(module, BATCH)


@pytest.fixture(scope="session")
def bases(gpt: tuple[Any, onnx.ModelProto]) -> dict[BaseKind, Base]:
    """The float base and its 4-bit MatMulNBits and int8 DequantizeLinear versions."""
    return {kind: make_base(gpt[1], kind) for kind in ("float", "nbits", "dql")}
