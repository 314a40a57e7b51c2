"""Every fuzz target of ``fuzz/`` runs a few thousand inputs (the plain mutation driver, seeded from the fixtures)
in a subprocess, so a crash fails this test instead of killing pytest. Long runs: fuzz/README.md."""

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = sorted(os.path.basename(p)[5:-3] for p in glob.glob(os.path.join(ROOT, "fuzz", "fuzz_*.py")))


def test_every_target_is_listed():
    assert set(TARGETS) >= {
        "record",
        "columns",
        "scan",
        "frame",
        "consume_queue",
        "checkpoint",
        "config_json",
        "index",
        "open_store",
        "filter",
        "open_snapshot",
    }


# opening a store is about 13 ms an input; a snapshot input about 130 ms (a copy opened and closed first, and 60 ms
# for its files to age past the vouch window); the decoders take microseconds
RUNS = {"open_store": 500, "open_snapshot": 100}


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_smoke(target):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = os.path.join(ROOT, "fuzz", f"fuzz_{target}.py")
    runs = RUNS.get(target, 2000)
    proc = subprocess.run(
        # faulthandler: a SIGBUS or SIGSEGV prints every thread's Python stack into the failure message (open_store
        # once died on SIGBUS with no output: its power-image builder cut the power under a running store)
        [sys.executable, "-X", "faulthandler", script, "--plain", "--runs", str(runs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert f"Done {runs} runs" in proc.stdout
