"""``benchmarks/distributed.py`` runs its two configurations and reports what docs/distributed.md records."""

from __future__ import annotations

from pathlib import Path

import pytest

#: One mpiexec job at a time: each starts ranks of its own, which would oversubscribe the cores.
pytestmark = pytest.mark.xdist_group("mpiexec")


def test_the_distributed_benchmark_reports_throughput_and_the_all_reduce_share(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the benchmark exports its workloads with torch")
    pytest.importorskip("mpi4py", reason="the MPI extra is not installed: pip install -e '.[mpi]'")
    import json

    from benchmarks import distributed

    out = tmp_path / "results.json"
    assert distributed.main(["--workloads", "linreg", "--steps", "20", "--warmup", "3", "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    single, double = result["1x2"], result["2x1"]
    assert (single["processes"], single["threads"], double["processes"], double["threads"]) == (1, 2, 2, 1)
    assert single["samples_per_s"] > 0 and double["samples_per_s"] > 0
    assert 0 < double["reduce_share"] < 1 and single["reduce_share"] == 0
    assert double["sent_bytes_per_step"] == 11 * 4  # linreg's 10 weights and its bias, float32, once per step
