"""``benchmarks.real_size`` reuses a workload's artifacts only when the onnxtrain sources that wrote them are these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.real_size import __main__ as real_size


def test_artifacts_written_by_other_sources_are_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepares: list[list[str]] = []

    def worker(argv: list[str]) -> dict[str, Any]:  # what the prepare worker leaves behind
        prepares.append(argv)
        folder = Path(argv[argv.index("--folder") + 1])
        (folder / "artifacts").mkdir(parents=True, exist_ok=True)
        (folder / "artifacts" / "checkpoint").write_bytes(b"")
        (folder / "spec.json").write_text("{}")
        return {"export_s": 0.0}

    monkeypatch.setattr(real_size, "_worker", worker)
    sources = real_size.onnxtrain_sources()
    assert len(sources) == 16 and sources == real_size.onnxtrain_sources()
    folder, result = real_size.prepared("gpt2-tiny", tmp_path)
    assert len(prepares) == 1 and "reused" not in result
    assert (folder / "artifacts.sources").read_text().strip() == sources
    assert real_size.prepared("gpt2-tiny", tmp_path) == (folder, {"reused": True}) and len(prepares) == 1
    monkeypatch.setattr(real_size, "onnxtrain_sources", lambda: "0" * 16)  # the code changed since
    assert "reused" not in real_size.prepared("gpt2-tiny", tmp_path)[1] and len(prepares) == 2
    (folder / "artifacts.sources").unlink()  # written before the record existed
    assert "reused" not in real_size.prepared("gpt2-tiny", tmp_path)[1] and len(prepares) == 3
