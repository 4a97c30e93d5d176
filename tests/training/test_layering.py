"""The runtime's modules import in one direction and use only each other's public names (docs/runtime.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import onnxtrain.training

PACKAGE = Path(onnxtrain.training.__file__).parent

#: Private names of onnxruntime's Python wrappers that the binding reads on purpose (onnxtrain.training.binding).
ONNXRUNTIME_INTERNALS = frozenset({"_sess", "_iobinding", "_ortvalue", "_get_c_device"})
#: ``(module, name)``: a class's private state read by a view class of the same module.
SAME_MODULE_VIEWS = frozenset({("state", "_properties")})


def _imports(path: Path) -> set[str]:
    """The runtime modules ``path`` imports anywhere (top level, functions, ``TYPE_CHECKING`` blocks)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("onnxtrain.training."):
                found.add(node.module.split(".")[2])
            elif node.module == "onnxtrain.training":
                found.update(alias.name for alias in node.names)
    return found - {path.stem}


def _modules() -> dict[str, set[str]]:
    return {path.stem: _imports(path) for path in PACKAGE.glob("*.py") if path.stem != "__init__"}


def test_the_runtime_modules_import_in_one_direction() -> None:
    graph = _modules()
    done: list[str] = []
    while len(done) < len(graph):
        ready = sorted(name for name, deps in graph.items() if name not in done and deps <= set(done))
        assert ready, f"an import cycle among {sorted(set(graph) - set(done))}"
        done += ready
    # the order a newcomer reads them in: the state, then the steps, then the objects that drive them
    position = {name: i for i, name in enumerate(done)}
    assert position["store"] < position["fused"] < position["epoch"] < position["module"] < position["optimizer"]
    assert position["optimizer"] < position["schedulers"] < position["session"]
    # what the models take and give before the state; the epoch's session before the pass that drives it
    assert position["tensor_spec"] < position["inputs"] < position["model_io"] < position["store"]
    assert position["epoch"] < position["train_epoch"] < position["module"]


def test_no_module_reads_another_ones_private_names() -> None:
    offences = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in ONNXRUNTIME_INTERNALS or (path.stem, node.attr) in SAME_MODULE_VIEWS:
                continue
            offences.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert not offences, offences
