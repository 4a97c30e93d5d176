"""The oldest releases `make test` runs the suite with are the lower bounds pyproject.toml declares.

constraints-oldest.txt pins onnx and onnxruntime for the second pass of
`make test` (.venv-oldest); pyproject.toml declares ``>=`` the same versions, so
that the oldest release a user may install is one the suite passed with.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints-oldest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints-oldest.txt: {line!r} is no exact pin (name==version)"
            pins[name.strip().lower()] = version.strip()
    return pins


def _floors() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib comes with Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)\s*", requirement)
        if match:
            floors[match.group(1).lower()] = match.group(2)
    return floors


def test_the_pins_are_the_declared_floors() -> None:
    pins, floors = _pins(), _floors()
    assert set(pins) >= {"onnx", "onnxruntime"}, f"constraints-oldest.txt pins {sorted(pins)}"
    for name, version in pins.items():
        assert name in floors, f"constraints-oldest.txt pins {name}, which pyproject.toml has no lower bound for"
        assert Version(floors[name]) == Version(version), (
            f"pyproject.toml declares {name}>={floors[name]}, constraints-oldest.txt tests {name}=={version}: "
            "make them the same version"
        )
