"""perf/plots.py (issue 14, item 8) draws its four PNGs from a benchmark JSON: the one committed in perf/results."""

import json
import os
import subprocess
import sys

from helpers import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "perf", "results", "2026-11-24-bench.json")


def test_plots_are_drawn_from_a_run(tmp_path):
    require("matplotlib")
    out = tmp_path / "plots"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "perf", "plots.py"), RESULTS, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(os.listdir(out))
    assert names == ["latency.png", "recovery.png", "scaling.png", "throughput.png"]
    for n in names:
        data = (out / n).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, n
    # every figure had data: the run holds each kind of row it draws
    with open(RESULTS) as f:
        extra = [b["extra_info"] for b in json.load(f)["benchmarks"]]
    assert any("latency_us" in e for e in extra) and any(e.get("scenario") == "recovery_by_size" for e in extra)
    assert "no data" not in proc.stdout
