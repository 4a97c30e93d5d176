"""The package imports one way: the layers of docs/design.md's table, and no modules importing each other in a circle.

Every ``import`` and ``from ... import`` of ``onnxtrain`` counts, at the top of
a module, inside a function or under ``TYPE_CHECKING``: a module may import
its own folder and the layers below its own, nothing above or beside it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "onnxtrain"
DESIGN = ROOT / "docs" / "design.md"

#: ``(importer, imported)`` circles allowed, with the reason. None today.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}


def layers() -> dict[str, int]:
    """``{folder or module: layer}`` from the table of docs/design.md's "Layers" section."""
    found: dict[str, int] = {}
    for line in DESIGN.read_text(encoding="utf-8").splitlines():
        row = re.match(r"\| (\d+) \| (.+?) \|", line)
        if row:
            for unit in re.findall(r"`([^`]+)`", row.group(2)):
                found[unit.removesuffix("/").removesuffix(".py")] = int(row.group(1))
    return found


def modules() -> dict[str, Path]:
    """``{dotted name: path}`` of every module of the package (a package by its ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, name: str, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """``(line, module)``: each onnxtrain module ``path`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            if not base.startswith("onnxtrain"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full == "onnxtrain.__version__":  # a constant of the root package, which Python imports first anyway
                    continue
                yield node.lineno, full if full in known else base
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("onnxtrain"):
                    yield node.lineno, alias.name


def unit_of(module: str) -> str:
    """The folder or top-level module a dotted module name belongs to: ``onnxtrain.graph.walk`` -> ``graph``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_folder_and_module_has_a_layer() -> None:
    table = layers()
    units = {unit_of(name) for name in modules()} - {"__init__"}
    assert sorted(units - set(table)) == [], "give these a row in docs/design.md's Layers table"
    assert sorted(set(table) - units) == [], "the Layers table names folders the package lacks"


def test_imports_go_down_the_layers_or_stay_in_their_folder() -> None:
    table, known = layers(), modules()
    offences = []
    for name, path in sorted(known.items()):
        unit = unit_of(name)
        if unit == "__init__":  # the package's re-exports
            continue
        for line, imported in imports(path, name, known):
            other = unit_of(imported)
            if other == unit:
                continue
            if other == "__init__" or table[other] >= table[unit]:
                where = path.relative_to(ROOT)
                offences.append(f"{where}:{line}: {unit} (layer {table[unit]}) imports {imported}")
    assert offences == [], "\n".join(offences)


def test_no_modules_import_each_other_in_a_circle() -> None:
    known = modules()
    graph = {name: {imported for _, imported in imports(path, name, known)} - {name} for name, path in known.items()}
    circles = [frozenset(c) for c in _strongly_connected(graph) if len(c) > 1]
    unexplained = [sorted(c) for c in circles if c not in ALLOWED_CIRCLES]
    assert unexplained == [], unexplained


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def test_the_checks_see_a_circle_and_an_upward_import() -> None:
    """A test of the test: a made-up circle is found, and the table is read."""
    assert sorted(map(sorted, (c for c in _strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) if len(c) > 1)))
    table = layers()
    assert table["graph"] < table["autodiff"] < table["artifacts"] < table["training"] < table["cli"]
