"""A node's attributes as Python values: the one place that reads ``AttributeProto``.

Values are ``onnx.helper.get_attribute_value``'s: an ``int``, a ``float``,
``bytes`` for a string (not decoded; :func:`text_attribute` decodes it), a
``TensorProto``, a ``GraphProto``, or a list of one of these.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """``{name: value}`` of every attribute ``node`` sets."""
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of ``node``'s attribute ``name``, or ``default`` where it is not set."""
    for found in node.attribute:
        if found.name == name:
            return helper.get_attribute_value(found)
    return default


def text_attribute(node: onnx.NodeProto, name: str, default: str) -> str:
    """``node``'s string attribute ``name``, decoded (``reduction``, ``mode``), or ``default`` where it is not set."""
    value = attribute(node, name, default)
    return value.decode() if isinstance(value, bytes) else value
