"""The research notebooks in ``notebooks/`` run from a fresh kernel, and are committed executed and listed.

Each notebook is executed in memory with nbclient (the committed file is never
written), in the notebooks' folder, by a kernel that runs this interpreter: a
``python3`` kernelspec pointing at ``sys.executable`` is written to a temporary
``JUPYTER_PATH``, which takes precedence over any user or system kernelspec of
that name.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds per cell
#: Seconds a fresh kernel may take to start: nbclient's default 60 s was once too short on a 2-core machine with
#: both cores running the other tests (01_custom_loss, "Kernel didn't respond in 60 seconds", 2026-11-28).
STARTUP_TIMEOUT = 300
MAX_BYTES = 400 * 1024


@pytest.fixture
def python3_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``python3`` kernelspec that starts ``sys.executable``, found first through ``JUPYTER_PATH``."""
    pytest.importorskip("ipykernel", reason="ipykernel is needed to run the notebooks (pip install -e '.[test]')")
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (onnxtrain tests)",
                "language": "python",
                "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"},  # no debugger warning about frozen modules
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    from jupyter_client.kernelspec import KernelSpecManager

    resolved = KernelSpecManager().get_kernel_spec("python3")
    assert resolved.argv[0] == sys.executable, resolved.argv
    return "python3"


def test_there_are_notebooks() -> None:
    assert len(PATHS) >= 6, f"expected the six research notebooks in {NOTEBOOKS}, found {[p.name for p in PATHS]}"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_is_listed_executed_and_small(path: Path) -> None:
    """Listed in notebooks/README.md, saved with the outputs of one run from the top, without errors."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat is needed to read the notebooks")
    readme = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    assert path.name in readme, f"{path.name} is not listed in notebooks/README.md"
    assert path.stat().st_size < MAX_BYTES, f"{path.name} is {path.stat().st_size // 1024} KB (limit 400 KB)"
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.source.strip()]
    assert code, f"{path.name} has no code cells"
    counts = [cell.get("execution_count") for cell in code]
    assert None not in counts, f"{path.name} was saved with unexecuted cells: run it and save it with its outputs"
    assert counts == list(range(1, len(code) + 1)), f"{path.name} was not run once from the top: {counts}"
    assert any(cell.outputs for cell in code), f"{path.name} was saved without outputs"
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} was saved with an error: {errors[0].get('ename')}: {errors[0].get('evalue')}"


def test_readme_lists_only_existing_notebooks() -> None:
    listed = set(re.findall(r"[\w.-]+\.ipynb", (NOTEBOOKS / "README.md").read_text(encoding="utf-8")))
    assert listed == {p.name for p in PATHS}, f"README lists {sorted(listed)}, the folder has {[p.name for p in PATHS]}"


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_runs(path: Path, python3_kernel: str) -> None:
    """Every cell of a copy of the notebook runs without raising, in the notebooks' folder, in a fresh kernel."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat is needed to run the notebooks")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is needed to run the notebooks")
    before, files = path.read_bytes(), sorted(NOTEBOOKS.iterdir())
    notebook = nbformat.reads(before.decode("utf-8"), as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT,
        startup_timeout=STARTUP_TIMEOUT,
        kernel_name=python3_kernel,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, when a cell raises
    errors = [
        o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"
    ]
    assert not errors
    assert path.read_bytes() == before, f"running {path.name} changed the committed file"
    assert sorted(NOTEBOOKS.iterdir()) == files, f"running {path.name} left files in {NOTEBOOKS}"
