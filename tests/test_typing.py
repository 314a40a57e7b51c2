"""The public API type-checks: ``mypy --strict`` passes on the bottom layer, the compiled modules' stubs and a
program using the API (config: [tool.mypy] in pyproject.toml), reports every misuse in a second program, and
``mypy.stubtest`` finds the stubs true to the compiled modules."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISUSE = os.path.join("tests", "typing", "misuse_public_api.py")
COMPILED = [
    "localmq._native",
    "localmq._msg_id",
    "localmq._record",
    "localmq._columns",
    "localmq._scan",
    "localmq._snapshot",
    "localmq._mapping",
    "localmq._mapped_file",
    "localmq._frame",
    "localmq._index",
    "localmq.store.commit_log",
    "localmq.store.shared_commit",
    "localmq.store.put_args",
    "localmq.store.put_result",
    "localmq.store.group_commit",
    "localmq.store.consume_queue",
    "localmq.store.get",
    "localmq.store.dispatch",
    "localmq._shm",
]


def run_mypy(*args):
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install mypy (or pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO] + [p for p in sys.path if p])}
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_public_api_is_strictly_typed():
    r = run_mypy("mypy")  # files and strictness from [tool.mypy]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout


def test_misuse_of_the_public_api_is_reported():
    expected = {}
    with open(os.path.join(REPO, MISUSE)) as f:
        for n, line in enumerate(f, 1):
            m = re.search(r"# E: ([\w-]+)$", line)
            if m:
                expected[n] = m.group(1)
    assert len(expected) >= 8
    r = run_mypy("mypy", MISUSE)
    assert r.returncode == 1, r.stdout + r.stderr
    found = {}
    for m in re.finditer(r"^" + re.escape(MISUSE) + r":(\d+): error: .*\[([\w-]+)\]$", r.stdout, re.M):
        found.setdefault(int(m.group(1)), set()).add(m.group(2))
    assert set(found) == set(expected), r.stdout
    for n, code in expected.items():
        assert found[n] == {code}, (n, r.stdout)


def test_stubs_match_the_compiled_modules():
    allow = ["--allowlist", os.path.join(".ci", "stubtest_allowlist.txt")]
    if sys.version_info < (3, 12):
        allow += ["--allowlist", os.path.join(".ci", "stubtest_allowlist_py311.txt")]
    r = run_mypy("mypy.stubtest", *allow, *COMPILED)
    assert r.returncode == 0, r.stdout + r.stderr
