"""The gradient rule registry: one rule per (domain, operator, opset range).

A rule is pure math. It receives a :class:`~onnxtrain.autodiff.context.RuleContext`
and the gradient names of the node's outputs (``None`` where no gradient flows),
and returns one entry per node input (``None``: no gradient for that input)::

    registry = GradientRegistry()

    @registry.rule("Exp")
    def exp(ctx, grads):
        '''d/dx exp(x) = y'''
        return [ctx.mul(grads[0], ctx.outputs[0])]

    # or, instead, the same rule in one line:
    registry.unary("Exp", "dx = g * y", lambda ctx, g, x, y: ctx.mul(g, y))

Family helpers make most rules one line, in the manner of JAX's ``deflinear``:
:meth:`~GradientRegistry.unary` (``dx = f(g, x, y)``), :meth:`~GradientRegistry.derivative`
(``dx = g * f'(x)``) and :meth:`~GradientRegistry.linear` (``dx = adjoint(g)``).

Operators declared *non-differentiable* (``Shape``, ``Floor``, comparisons, ...)
stop the gradient; an operator with *no rule* on the path to the loss is an
error. A *straight-through* pair (:meth:`~GradientRegistry.straight_through`:
``QuantizeLinear`` read by ``DequantizeLinear``) carries the path through the
first's integer outputs into the second, whose rule differentiates both.

The built-in registry (:func:`onnxtrain.autodiff.rules.builtin_registry`)
is built and frozen by the package of the rules, which registers into it; this
module knows nothing of them. Extend a :meth:`~GradientRegistry.copy` of it for
custom operators.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxtrain.autodiff.context import RuleContext

#: What a rule receives: the gradient of each output of its node (``None`` where none flows).
Grads = Sequence["str | None"]
#: What a rule returns: one gradient (or ``None``) per input of its node.
Result = list["str | None"]
#: A rule: output gradients in, one input gradient (or ``None``) per node input out.
RuleFn = Callable[["RuleContext", Grads], Sequence["str | None"]]

#: An opset range: ``(since, until)``, both inclusive; ``until=None`` is open.
OpsetRange = tuple[int, "int | None"]

#: ``(ctx, g, x, y) -> dx``: the gradient of an operator's first input from its output's
#: (:meth:`~GradientRegistry.unary`).
UnaryGradient = Callable[["RuleContext", str, str, str], str]
#: ``(ctx, x, y) -> f'(x)``: the derivative of an element-wise function, which its rule multiplies by the output's
#: gradient (:meth:`~GradientRegistry.derivative`).
Derivative = Callable[["RuleContext", str, str], str]
#: ``(ctx, g) -> dx``: the adjoint of an operator linear in its data input (:meth:`~GradientRegistry.linear`).
Adjoint = Callable[["RuleContext", str], str]


def domain_key(domain: str) -> str:
    """The registry's key of an operator domain: ``""`` for ``ai.onnx``, else the domain."""
    return "" if domain == "ai.onnx" else domain


@dataclass(frozen=True)
class Rule:
    """A registered gradient rule.

    Attributes:
        domain: the operator's domain (``""`` is ``ai.onnx``).
        op_type: the operator.
        since, until: the opset versions (of ``domain``) the rule applies to, inclusive.
        fn: the rule function.
        inputs: indices of the inputs the rule differentiates, or ``None`` for
            "every input that can hold a floating-point tensor" (from the schema).
        broadcasting: the rule returns output-shaped gradients for inputs that
            broadcast; the engine sums them back to each input's shape.
    """

    domain: str
    op_type: str
    since: int
    until: int | None
    fn: RuleFn
    inputs: tuple[int, ...] | None
    broadcasting: bool

    def applies(self, opset: int) -> bool:
        """Whether the rule covers opset version ``opset`` of its domain."""
        return self.since <= opset and (self.until is None or opset <= self.until)

    def differentiable(self, index: int) -> bool:
        """Whether the rule may return a gradient for input ``index``."""
        if self.inputs is not None:
            return index in self.inputs
        return True

    @property
    def formula(self) -> str:
        """The first line of the rule's docstring: its math."""
        doc = (self.fn.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else ""


@dataclass(frozen=True)
class StraightThrough:
    """A straight-through pair's second operator, and the operators that may stand between the two."""

    reader: str
    through: frozenset[str] = frozenset()


class GradientRegistry:
    """Gradient rules and non-differentiable declarations, keyed by (domain, op_type).

    Register with the :meth:`rule` decorator and :meth:`non_differentiable`;
    the engine looks rules up with :meth:`lookup`. A frozen registry (the
    built-in one) refuses changes: use :meth:`copy` to extend it.
    """

    def __init__(self) -> None:
        self._rules: dict[tuple[str, str], list[Rule]] = {}
        self._non_differentiable: set[tuple[str, str]] = set()
        self._straight_through: dict[tuple[str, str], StraightThrough] = {}
        self._frozen = False

    # ------------------------------------------------------------ registering

    def _check_mutable(self, what: str) -> None:
        if self._frozen:
            raise RuntimeError(
                f"cannot {what}: this registry is frozen (the built-in one never changes). "
                "Register on a copy, `registry = builtin_registry().copy()`, and pass "
                "`registry=registry` to build_gradients"
            )

    def rule(
        self,
        op_type: str,
        *,
        domain: str = "",
        opsets: OpsetRange | None = None,
        inputs: Sequence[int] | None = None,
        broadcasting: bool = False,
        replace: bool = False,
    ) -> Callable[[RuleFn], RuleFn]:
        """Decorator registering a gradient rule for ``domain::op_type``.

        Args:
            op_type: the operator.
            domain: its domain (``""`` or ``"ai.onnx"`` for standard operators).
            opsets: ``(since, until)`` opset versions of ``domain``, inclusive;
                ``until=None`` is open-ended. ``None``: every version.
            inputs: indices of the differentiable inputs; ``None``: every input
                the schema allows a floating-point tensor in.
            broadcasting: the rule returns output-shaped gradients that the
                engine must sum back to the inputs' shapes.
            replace: drop existing rules whose opset ranges overlap (to override
                a built-in rule on a copy); otherwise an overlap is an error.
        """
        since, until = opsets if opsets is not None else (1, None)
        if since < 1 or (until is not None and until < since):
            raise ValueError(f"opsets={opsets!r} for {op_type} is not a range (since >= 1, until >= since or None)")
        key = (domain_key(domain), op_type)

        def register(fn: RuleFn) -> RuleFn:
            self._check_mutable(f"register a rule for {op_type}")
            if key in self._non_differentiable:
                raise ValueError(f"{_label(key)} is declared non-differentiable; it cannot also have a rule")
            new = Rule(key[0], op_type, since, until, fn, None if inputs is None else tuple(inputs), broadcasting)
            existing = self._rules.get(key, [])
            if replace:
                existing[:] = [old for old in existing if not _overlap((old.since, old.until), (since, until))]
            for old in existing:
                if _overlap((old.since, old.until), (since, until)):
                    raise ValueError(
                        f"a rule for {_label(key)} at opsets {old.since}-{old.until or ''} exists already "
                        f"({old.fn.__qualname__}); give the new rule a disjoint opset range, or pass replace=True"
                    )
            self._rules.setdefault(key, []).append(new)
            self._rules[key].sort(key=lambda r: r.since)
            return fn

        return register

    def non_differentiable(self, *op_types: str, domain: str = "") -> None:
        """Declare operators whose outputs carry no gradient (``Shape``, ``Floor``, ...)."""
        self._check_mutable("declare operators non-differentiable")
        for op_type in op_types:
            key = (domain_key(domain), op_type)
            if key in self._rules:
                raise ValueError(f"{_label(key)} has a gradient rule; it cannot also be non-differentiable")
            self._non_differentiable.add(key)

    def straight_through(self, producer: str, reader: str, *, through: Sequence[str] = (), domain: str = "") -> None:
        """Declare ``domain::producer``'s outputs, of any type, on the path where ``domain::reader`` reads each of them
        and nothing else does, directly or through operators of ``through`` (each read the same way): ``producer``
        and those are then not differentiated themselves, and ``reader``'s rule gives the gradient of them all to
        ``producer``'s inputs (:meth:`RuleContext.contribute <onnxtrain.autodiff.context.RuleContext.contribute>`).
        A straight-through estimator: ``QuantizeLinear``'s integer codes read by ``DequantizeLinear``, maybe
        narrowed by a ``Clip``. Where another operator reads them, ``producer`` needs a rule as any operator
        does."""
        self._check_mutable(f"declare {producer} straight-through")
        self._straight_through[(domain_key(domain), producer)] = StraightThrough(reader, frozenset(through))

    # ------------------------------------------------------------ rule families

    def unary(
        self,
        op_type: str,
        formula: str,
        gradient: UnaryGradient,
        *,
        domain: str = "",
        opsets: OpsetRange | None = None,
    ) -> RuleFn:
        """Register ``dx = gradient(ctx, g, x, y)`` for an operator of one output whose only differentiable input is
        the first, ``x`` (element-wise functions, reductions; the other inputs, such as axes, get no gradient).

        ``formula`` is the rule's math, as its docstring's first line would give it; ``domain``: the operator's
        (``""``: ``ai.onnx``; a custom operator's own).
        """

        def rule(ctx: RuleContext, grads: Grads) -> Result:
            g = grads[0]
            assert g is not None  # the engine calls a rule only when its output has a gradient
            return [gradient(ctx, g, ctx.inputs[0], ctx.outputs[0])] + [None] * (len(ctx.inputs) - 1)

        return self._register_family(op_type, domain, opsets, rule, gradient, formula)

    def derivative(
        self, op_type: str, *, domain: str = "", opsets: OpsetRange | None = None
    ) -> Callable[[Derivative], Derivative]:
        """Decorator registering ``dx = g * f'(x)`` for an element-wise operator of one input from ``f'(ctx, x, y)``,
        whose docstring gives the formula; it returns ``f'`` unchanged, for rules that reuse it. ``domain``: as for
        :meth:`unary`."""

        def register(derivative: Derivative) -> Derivative:
            def rule(ctx: RuleContext, grads: Grads) -> Result:
                return [ctx.mul(grads[0], derivative(ctx, ctx.inputs[0], ctx.outputs[0]))]  # type: ignore[arg-type]

            self._register_family(op_type, domain, opsets, rule, derivative, derivative.__doc__ or "")
            return derivative

        return register

    def linear(
        self,
        op_type: str,
        formula: str,
        adjoint: Adjoint,
        *,
        domain: str = "",
        opsets: OpsetRange | None = None,
    ) -> RuleFn:
        """Register ``dx = adjoint(ctx, g)`` for an operator linear in its first input, whose other inputs (shapes,
        axes, indices) carry no gradient: often the same data movement applied backwards (Reshape, Transpose).

        ``formula`` is the rule's math, as its docstring's first line would give it; ``domain``: as for
        :meth:`unary`.
        """

        def rule(ctx: RuleContext, grads: Grads) -> Result:
            g = grads[0]
            assert g is not None  # the engine calls a rule only when its output has a gradient
            return [adjoint(ctx, g)] + [None] * (len(ctx.inputs) - 1)

        return self._register_family(op_type, domain, opsets, rule, adjoint, formula)

    def _register_family(
        self,
        op_type: str,
        domain: str,
        opsets: OpsetRange | None,
        rule: RuleFn,
        source: Callable[..., str],
        formula: str,
    ) -> RuleFn:
        """Register ``rule`` (made by a family helper from ``source``) for input 0, named and documented as a rule."""
        rule.__doc__ = formula
        rule.__module__ = source.__module__
        name = source.__name__ if source.__name__ != "<lambda>" else _python_name(op_type)
        rule.__name__ = rule.__qualname__ = name
        return self.rule(op_type, domain=domain, opsets=opsets, inputs=(0,))(rule)

    def copy(self) -> GradientRegistry:
        """A mutable copy: register custom rules on it without touching this registry."""
        other = GradientRegistry()
        other._rules = {key: list(rules) for key, rules in self._rules.items()}
        other._non_differentiable = set(self._non_differentiable)
        other._straight_through = dict(self._straight_through)
        return other

    def freeze(self) -> GradientRegistry:
        """Refuse further changes (returns ``self``)."""
        self._frozen = True
        return self

    # --------------------------------------------------------------- queries

    def lookup(self, op_type: str, domain: str = "", opset: int | None = None) -> Rule | None:
        """The rule for ``domain::op_type`` at opset ``opset`` (any opset when ``None``)."""
        for rule in self._rules.get((domain_key(domain), op_type), []):
            if opset is None or rule.applies(opset):
                return rule
        return None

    def is_non_differentiable(self, op_type: str, domain: str = "") -> bool:
        """Whether ``domain::op_type`` was declared non-differentiable."""
        return (domain_key(domain), op_type) in self._non_differentiable

    def straight_through_of(self, op_type: str, domain: str = "") -> StraightThrough | None:
        """How ``domain::op_type``'s outputs reach the operator that differentiates it with itself
        (:meth:`straight_through`), else ``None``."""
        return self._straight_through.get((domain_key(domain), op_type))

    def rules(self) -> list[Rule]:
        """Every registered rule, sorted by domain, operator and opset."""
        return sorted(
            (r for rules in self._rules.values() for r in rules), key=lambda r: (r.domain, r.op_type, r.since)
        )

    def operators(self) -> set[tuple[str, str]]:
        """The (domain, op_type) pairs that have a rule."""
        return set(self._rules)

    def non_differentiable_operators(self) -> set[tuple[str, str]]:
        """The (domain, op_type) pairs declared non-differentiable."""
        return set(self._non_differentiable)

    def straight_through_pairs(self) -> dict[tuple[str, str], StraightThrough]:
        """``{(domain, producer): (reader, through)}`` for each pair declared with :meth:`straight_through`."""
        return dict(self._straight_through)


def _python_name(op_type: str) -> str:
    """``leaky_relu`` for ``LeakyRelu``: the name a rule registered from a lambda goes by in messages."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


def _label(key: tuple[str, str]) -> str:
    return f"{key[0] or 'ai.onnx'}::{key[1]}"


def _overlap(a: OpsetRange, b: OpsetRange) -> bool:
    a_end = a[1] if a[1] is not None else 1 << 30
    b_end = b[1] if b[1] is not None else 1 << 30
    return a[0] <= b_end and b[0] <= a_end


__all__ = [
    "Adjoint",
    "Derivative",
    "GradientRegistry",
    "Grads",
    "OpsetRange",
    "Result",
    "Rule",
    "RuleFn",
    "StraightThrough",
    "UnaryGradient",
    "domain_key",
]
