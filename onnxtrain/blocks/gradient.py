"""``Gradient``: derivatives of a model's values as a block, for losses that contain them.

``Gradient(wrt="x")(y)`` appends to the base model the vector-Jacobian
product of ``y`` with a cotangent ``v`` (ones, or the value ``grad_output``):
``dx = sum_i v_i * d y_i / d x``, by :func:`onnxtrain.autodiff.build_vjp`. With
ones it is the gradient of ``sum(y)``; where the rows of ``y`` depend only on
the same rows of ``x`` (a network applied point by point), row ``i`` of ``dx``
is the derivative of ``y_i`` by ``x_i``: ``u_x`` of a physics-informed
network ``u(x)``. The emitted nodes are standard ONNX operators like the rest
of the model, so they can be differentiated again: a ``Gradient`` of a
``Gradient`` is a second derivative (``u_xx``), and a loss containing one
trains through it (the training model's parameter gradients are then second
derivatives of the network).
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxtrain import caller
from onnxtrain.autodiff import GradientRegistry, build_vjp
from onnxtrain.blocks.block import Block
from onnxtrain.graph import ops


class Gradient(Block):
    """``sum_i v_i * d y_i / d wrt`` for ``y`` the block's input, ``v`` ones or ``grad_output``.

    Args:
        wrt: the value (graph input, intermediate value or initializer) to
            differentiate with respect to, or a list of them.
        grad_output: the name of the cotangent ``v``, a value of ``y``'s type
            and shape; ``None``: ones (the gradient of ``sum(y)``).
        registry: the gradient rules; ``None``: those of the training block
            being built (its ``registry``, ``generate_artifacts``' too), else
            the built-in ones.

    Returns the name of the gradient (a tuple of names when ``wrt`` is a
    list), of the shape and type of its ``wrt`` value. A ``wrt`` value that
    ``y`` does not depend on (or only through operators without a gradient,
    such as the comparison in ``Relu``'s derivative) gets zeros of its shape,
    and a warning says so.
    """

    def __init__(
        self, wrt: str | Sequence[str], grad_output: str | None = None, *, registry: GradientRegistry | None = None
    ) -> None:
        super().__init__()
        self._registry = registry
        if isinstance(wrt, str):
            self._wrt, self._single = [wrt], True
        else:
            self._wrt, self._single = list(wrt), False
            if not self._wrt or not all(isinstance(name, str) for name in self._wrt):
                raise TypeError(f"Gradient(wrt=...) takes a value name or a non-empty list of names, not {wrt!r}")
        self._grad_output = grad_output

    def build(self, output_name: str) -> str | tuple[str, ...]:
        b = self.builder
        b.require(output_name, role="value to differentiate")
        seed = self._grad_output if self._grad_output is not None else ops.filled_like(b, output_name, 1.0, "ones")
        found = build_vjp(b, {output_name: seed}, self._wrt, self._registry or b.gradient_registry)
        names = []
        for name in self._wrt:
            gradient = found[name]
            if gradient is None:
                caller.warn(
                    f"Gradient: {output_name!r} does not depend on {name!r} through differentiable operators; "
                    "its gradient is zeros",
                )
                gradient = ops.filled_like(b, name, 0.0, f"{name}_zero_grad")
            known = b.type_of(name)
            if known is not None:
                b.declare_type(gradient, known)  # its value's shape, symbolic dimensions included
            names.append(gradient)
        return names[0] if self._single else tuple(names)


__all__ = ["Gradient"]
