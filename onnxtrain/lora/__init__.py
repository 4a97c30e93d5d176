"""LoRA: low-rank adapters beside a base model's weights, trained with onnxtrain, merged back for inference.

``add_adapters(model, targets, rank, alpha, dropout)`` gives a copy of the model
computing ``y = x W + (alpha / rank) * dropout(x) A B`` at each targeted product
and the adapters' names (what to pass as ``requires_grad``); ``merge_adapters``
folds trained adapters back into the weights. Quantized bases
(``DequantizeLinear`` + ``MatMul``, ``com.microsoft::MatMulNBits``) train their
adapters too; ``adapters_of(model)`` lists the adapters a model has. See ``docs/lora.md``.
"""

from __future__ import annotations

from onnxtrain.lora.add import Init, add_adapters
from onnxtrain.lora.merge import merge_adapters
from onnxtrain.lora.record import METADATA_KEY, Adapter, Placement, adapters_of

__all__ = ["METADATA_KEY", "Adapter", "Init", "Placement", "adapters_of", "add_adapters", "merge_adapters"]
