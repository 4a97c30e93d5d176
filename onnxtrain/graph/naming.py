"""Deterministic, collision-free names for the values and nodes a build adds."""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence

import onnx

from onnxtrain.graph.walk import subgraphs

_UNSAFE = re.compile(r"[^0-9A-Za-z_.:/-]+")
#: How torch's TorchScript exporter begins the names of the constants it computes (``onnx::MatMul_658``).
GENERATED = "onnx::"


def names_in(graph: onnx.GraphProto) -> set[str]:
    """Every name a graph already uses: values, initializers, inputs, outputs and nodes.

    Names inside subgraphs (``If``/``Loop``/``Scan`` bodies) count too: a value
    of the outer graph must not share its name with one a subgraph defines.
    """
    names: set[str] = set()
    names.update(value.name for value in graph.input)
    names.update(value.name for value in graph.output)
    names.update(value.name for value in graph.value_info)
    names.update(tensor.name for tensor in graph.initializer)
    names.update(tensor.values.name for tensor in graph.sparse_initializer)
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        if node.name:
            names.add(node.name)
        for subgraph in subgraphs(node):
            names.update(names_in(subgraph))
    names.discard("")
    return names


def keep_or_tag(taken: set[str], tag: str) -> Callable[[str], str]:
    """A function giving ``name`` where ``taken`` lacks it, else ``name.<tag>N`` with the first free ``N``.

    What it gives is added to ``taken``: merging one graph into another keeps
    every name the two do not share, and marks each renamed one.
    """

    def give(name: str) -> str:
        if name in taken:
            index = 0
            while f"{name}.{tag}{index}" in taken:
                index += 1
            name = f"{name}.{tag}{index}"
        taken.add(name)
        return name

    return give


def first_free(name: str, taken: set[str]) -> str:
    """``name``, or else ``name_1``, ``name_2``... the first not in ``taken``; what it gives is added to it."""
    candidate, counter = name, 0
    while candidate in taken:
        counter += 1
        candidate = f"{name}_{counter}"
    taken.add(candidate)
    return candidate


class NameGenerator:
    """Hands out ``hint_N`` names that no other value or node of the graph uses.

    The counter belongs to one build, so the same sequence of blocks on the same
    base model gives the same names in every process.
    """

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken: set[str] = set(taken)
        self._added: list[str] = []
        self._counter = 0

    def __contains__(self, name: str) -> bool:
        return name in self._taken

    def reserve(self, name: str) -> None:
        """Mark ``name`` as used (a name the caller chose, e.g. a target input)."""
        if name not in self._taken:
            self._taken.add(name)
            self._added.append(name)

    def fresh(self, hint: str) -> str:
        """A new unused name that starts with ``hint``."""
        stem = _UNSAFE.sub("_", hint) or "value"
        while True:
            name = f"{stem}_{self._counter}"
            self._counter += 1
            if name not in self._taken:
                self.reserve(name)
                return name

    def state(self) -> tuple[int, int]:
        """A snapshot for :meth:`restore`: the counter and how many names were added."""
        return self._counter, len(self._added)

    def restore(self, state: tuple[int, int]) -> None:
        """Forget every name handed out or reserved since the snapshot ``state``."""
        self._counter, added = state
        while len(self._added) > added:
            self._taken.discard(self._added.pop())


def matches(pattern: str, name: str) -> bool:
    """Whether glob ``pattern`` matches the whole ``name`` or the part of it after one of its dots (``fnmatch``,
    case-sensitive: ``"bias"`` matches ``fc.bias``), as PEFT's ``target_modules`` match a module's last parts."""
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, f"*.{pattern}")


def unknown_name_hint(name: object, known: Iterable[str], *, shown: int = 10) -> str:
    """The end of an error about ``name``, which is not one of ``known``: the closest of them, then the first
    ``shown`` and how many more (a model's 148 parameters are not listed whole)."""
    names = list(known)
    if not isinstance(name, str):
        return f"names are str, not {type(name).__name__}; the {len(names)} known: " + first_names(names, shown)
    close = difflib.get_close_matches(name, names, n=3)
    guess = f"did you mean {', '.join(repr(n) for n in close)}? " if close else ""
    return f"{guess}the {len(names)} known: {first_names(names, shown)}"


def first_names(names: Sequence[str], shown: int) -> str:
    """The first ``shown`` of ``names``, quoted, then how many more there are."""
    listed = ", ".join(repr(n) for n in names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")
