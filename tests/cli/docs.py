"""The examples of docs/cli.md, as written there, for the tests that run them."""

from __future__ import annotations

import re
from pathlib import Path

#: The command's documentation.
CLI_DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def python_example(first_line: str) -> str:
    """The ```python block of docs/cli.md whose first line is ``first_line`` (``# mse_plus_l1.py``)."""
    blocks = re.findall(r"^```python\n(.*?)^```$", CLI_DOCS.read_text(encoding="utf-8"), flags=re.M | re.S)
    found = [block for block in blocks if block.splitlines()[0] == first_line]
    assert len(found) == 1, f"docs/cli.md has {len(found)} python blocks starting with {first_line!r}"
    return found[0]


def section_commands(heading: str) -> list[str]:
    """The ``$ onnxtrain ...`` lines of docs/cli.md's section ``## heading``, without ``$ ``."""
    text = CLI_DOCS.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    lines = text[start : None if end < 0 else end].splitlines()
    return [line[2:] for line in lines if line.startswith("$ onnxtrain ")]


def console_commands(fragment: str) -> list[str]:
    """The ``$ onnxtrain ...`` lines of docs/cli.md's console blocks that contain ``fragment``, without ``$ ``."""
    lines = CLI_DOCS.read_text(encoding="utf-8").splitlines()
    return [line[2:] for line in lines if line.startswith("$ onnxtrain ") and fragment in line]
