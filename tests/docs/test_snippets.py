"""Every example of README.md and docs/*.md runs as written.

Each fenced ``python`` block runs here, in a temporary working directory,
with what its comment line above it names (``<!-- snippet: ... -->``):

- ``setup NAME``: the files and names :mod:`tests.docs.setups` ``NAME`` makes;
- ``continues``: after the previous block of the same page, in its scope;
- ``standalone`` (or no comment): nothing but an empty directory;
- ``tested by PATH``: run by that test module, which names the page;
- ``... needs MODULE[,MODULE]`` after any of these: skipped where a module
  is missing (torch, transformers).

``bash`` and ``console`` blocks with such a comment run their ``onnxtrain``
command lines through the command itself, each expected to succeed; blocks
without one are shell set-up (``make demo``) and are not run. A ``python``
block needs no comment to run; a command block that names a file needs one.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.setups import SETUPS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!-- snippet: (.*?) -->")
COMMAND_BLOCKS = ("bash", "console", "sh", "shell")


@dataclass(frozen=True)
class Snippet:
    """One fenced block: where it is, its language and code, and what its comment line says."""

    page: Path
    line: int
    language: str
    code: str
    marker: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def needs(self) -> list[str]:
        _, _, modules = self.marker.partition(" needs ")
        return [m.strip() for m in modules.split(",") if m.strip()]

    @property
    def kind(self) -> str:
        return self.marker.partition(" needs ")[0].strip() or "standalone"


def snippets(page: Path) -> list[Snippet]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        marker = MARKER.fullmatch(before[-1].strip()) if before else None
        line = text[: match.start()].count("\n") + 1
        found.append(Snippet(page, line, match.group(1), match.group(2), marker.group(1) if marker else ""))
    return found


def chains() -> list[list[Snippet]]:
    """The python blocks and the marked command blocks, each with the blocks that continue it."""
    runs: list[list[Snippet]] = []
    for page in PAGES:
        for snippet in snippets(page):
            runnable = snippet.language == "python" or (snippet.language in COMMAND_BLOCKS and snippet.marker)
            if not runnable or snippet.kind.startswith("tested by"):
                continue
            if snippet.kind == "continues":
                assert runs and runs[-1][0].page == page, f"{snippet.id} continues no block of its page"
                runs[-1].append(snippet)
            else:
                runs.append([snippet])
    return runs


def _commands(snippet: Snippet) -> list[list[str]]:
    """The ``onnxtrain`` command lines of a command block, without prompts and comments."""
    commands = []
    for raw in snippet.code.splitlines():
        line = raw.strip().removeprefix("$ ")
        if line.startswith("onnxtrain "):
            commands.append(shlex.split(line, comments=True)[1:])
    return commands


def _run(snippet: Snippet, scope: dict) -> None:
    if snippet.language == "python":
        exec(compile(snippet.code, snippet.id, "exec"), scope)
        return
    from onnxtrain.cli import main

    for argv in _commands(snippet):
        output = io.StringIO()
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            status = main(argv)
        assert status == 0, f"{snippet.id}: onnxtrain {shlex.join(argv)} exited {status}:\n{output.getvalue()}"


@pytest.mark.parametrize("chain", chains(), ids=lambda chain: chain[0].id)
def test_the_example_runs_as_written(chain: list[Snippet], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in {module for snippet in chain for module in snippet.needs}:
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # distributed.init() sets its own: restored after
    first = chain[0]
    scope: dict = {"__name__": "__snippet__"}
    if first.kind.startswith("setup "):
        scope.update(SETUPS[first.kind.removeprefix("setup ")](tmp_path))
    else:
        assert first.kind == "standalone", f"{first.id}: unknown snippet comment {first.marker!r}"
    for snippet in chain:
        _run(snippet, scope)


def test_examples_tested_elsewhere_are_named_there() -> None:
    """A ``tested by PATH`` block: PATH exists and names the page, so that the test and the page stay together."""
    for page in PAGES:
        for snippet in snippets(page):
            if snippet.kind.startswith("tested by "):
                test = ROOT / snippet.kind.removeprefix("tested by ").strip()
                assert test.is_file(), f"{snippet.id}: no test file {test}"
                assert page.name in test.read_text(encoding="utf-8"), f"{snippet.id}: {test} does not name {page.name}"


def test_every_marked_setup_exists_and_every_command_block_with_a_file_is_marked() -> None:
    for page in PAGES:
        for snippet in snippets(page):
            if snippet.kind.startswith("setup "):
                assert snippet.kind.removeprefix("setup ") in SETUPS, f"{snippet.id}: no setup {snippet.kind!r}"
            for module in snippet.needs:
                assert re.fullmatch(r"[\w.]+", module), f"{snippet.id}: bad module {module!r}"
            if snippet.language in COMMAND_BLOCKS and not snippet.marker:
                for argv in _commands(snippet):
                    assert "--help" in argv or "-h" in argv, (
                        f"{snippet.id}: `onnxtrain {shlex.join(argv)}` is not run by any test; give the block a "
                        "<!-- snippet: setup NAME --> comment"
                    )


def test_blocks_and_their_comments_are_read(tmp_path: Path) -> None:
    """A test of this test: fences, languages, comments and command lines as the runner reads them."""
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- snippet: setup mlp_model needs torch, transformers -->\n```python\nx = 1\n```\n\n"
        "<!-- snippet: continues -->\n\n```python\ny = x\n```\n\n```bash\nmake demo\n"
        "onnxtrain train run --data 'a b.npz'  # a comment\n$ onnxtrain inspect model.onnx\n```\n",
        encoding="utf-8",
    )
    first, second, third = snippets(page)
    assert (first.line, first.language, first.code, first.kind, first.needs) == (
        4, "python", "x = 1\n", "setup mlp_model", ["torch", "transformers"]
    )  # fmt: skip
    assert (second.kind, second.needs, second.code) == ("continues", [], "y = x\n")
    assert (third.language, third.marker) == ("bash", "")
    assert _commands(third) == [["train", "run", "--data", "a b.npz"], ["inspect", "model.onnx"]]
    assert len([s for s in snippets(ROOT / "README.md") if s.language == "python"]) >= 5
