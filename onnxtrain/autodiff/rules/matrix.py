"""Matrix products: MatMul, Gemm, Einsum."""

from __future__ import annotations

from collections.abc import Sequence

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.rules._builtin import REGISTRY as registry

Grads = Sequence["str | None"]
Result = list["str | None"]
