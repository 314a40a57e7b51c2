"""Every ```python block of README.md, run as a user would paste it: each in a fresh interpreter
(``python3 block.py``), in the test's tmp_path, with a 120 s timeout. A block must exit 0 without a traceback
on stderr, and must not name a path outside a temporary directory (no ``/data``, no ``"/tmp/..."``): it makes
its own store, with ``tempfile``, so that no block sees what another block or an earlier run left.

Convention for what a block prints (README.md follows it; keep to it when adding a block):

    ```python
    ...the program...
    ```

    It prints:

    ```text
    ...its standard output...
    ```

A ```text block right after a ```python block, with only a line starting with "It prints" and ending with ":"
between them, is that program's expected stdout. It is compared as doctest compares output, with ELLIPSIS (``...``
stands for any text: message ids, timestamps, offsets that depend on timing) and NORMALIZE_WHITESPACE (runs of
whitespace, blank lines included, compare equal). A ```python block without one is run and must exit 0, its output
unchecked. Every ```text block of the README must belong to a ```python block this way, and ``EXPECTED_BLOCKS``
counts the ```python blocks, so that none drops out of the test unnoticed.

Environment of a run: ``PYTHONPATH`` starts with the directory holding the localmq this test process imported (the
repository root for an in-place or editable build; in a checkout that is not built, the installed copy), then the
repository root, then what was there; ``SPARK_LOCAL_IP=127.0.0.1`` and ``PYSPARK_PYTHON`` = this interpreter for the
Spark block; ``TMPDIR`` (Python's tempfile, multiprocessing) and the JVM's ``java.io.tmpdir`` (Spark's scratch
directories and native libraries, through ``SPARK_SUBMIT_OPTS``) point into tmp_path, and the JVM writes no
``/tmp/hsperfdata_*`` file (``-XX:-UsePerfData``), so that a run leaves nothing in /tmp.
"""

import doctest
import os
import re
import signal
import subprocess
import sys
from typing import List, NamedTuple, Optional

import pytest

import localmq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
# the localmq these tests run against: the root that holds the package this process imported
BUILT = os.path.dirname(os.path.dirname(os.path.abspath(localmq.__file__)))

EXPECTED_BLOCKS = 10
TIMEOUT_S = 120

FENCE_RE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
PRINTS_RE = re.compile(r"\A\s*It prints[^\n]*:\s*\Z")
HEADING_RE = re.compile(r"^#+ +(.+?) *$", re.M)
# a string literal that is an absolute or home path ("/tmp/x", '/data', "~/x"): a block makes its paths in tempfile's
# directories instead
ABSOLUTE_PATH_RE = re.compile(r"""(?<![\w.])[rbRB]?["'](?:/|~/)""")


class Block(NamedTuple):
    id: str
    line: int
    code: str
    want: Optional[str]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "top"


def readme_blocks() -> List[Block]:
    """The ```python blocks of README.md in order, each with the output its "It prints:" ```text block promises."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    fences = list(FENCE_RE.finditer(text))
    # section headings, not the comments of the code blocks
    headings = [
        (h.start(), h.group(1))
        for h in HEADING_RE.finditer(text)
        if not any(f.start() < h.start() < f.end() for f in fences)
    ]
    blocks: List[Block] = []
    claimed = set()
    for i, m in enumerate(fences):
        if m.group(1) != "python":
            continue
        want = None
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        between = text[m.end() : nxt.start() if nxt is not None else len(text)]
        if nxt is not None and nxt.group(1) == "text" and PRINTS_RE.match(between):
            want = nxt.group(2)
            claimed.add(i + 1)
        else:
            head = between.lstrip().split("\n", 1)[0]
            assert not head.startswith("It prints"), (
                f"README.md line {text.count(chr(10), 0, m.start()) + 1}: {head!r} after a python block must be "
                f"followed by a ```text block and nothing else"
            )
        heading = [h for pos, h in headings if pos < m.start()]
        blocks.append(
            Block(
                f"{len(blocks) + 1}-{_slug(heading[-1] if heading else '')}",
                text.count("\n", 0, m.start()) + 1,
                m.group(2),
                want,
            )
        )
    for i, m in enumerate(fences):
        if m.group(1) == "text":
            assert i in claimed, (
                f"README.md line {text.count(chr(10), 0, m.start()) + 1}: a ```text block that "
                f'is no python block\'s "It prints:" output'
            )
    return blocks


BLOCKS = readme_blocks()


def test_every_python_block_is_found():
    assert len(BLOCKS) == EXPECTED_BLOCKS, [b.id for b in BLOCKS]
    assert len({b.id for b in BLOCKS}) == len(BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs_as_pasted(block, tmp_path):
    where = f"README.md line {block.line} ({block.id})"
    assert "/data" not in block.code, f"{where} refers to /data"
    bad = ABSOLUTE_PATH_RE.search(block.code)
    assert bad is None, f"{where} names a path outside a temporary directory: {block.code[bad.start() :][:60]!r}"

    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([BUILT, REPO, *path]))
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = sys.executable
    env["TMPDIR"] = str(scratch)
    env["SPARK_SUBMIT_OPTS"] = " ".join(
        filter(None, [env.get("SPARK_SUBMIT_OPTS"), f"-Djava.io.tmpdir={scratch}", "-XX:-UsePerfData"])
    )

    # a session of its own, so that a block that hangs is ended with everything it started (pool workers, a JVM)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{where} did not end within {TIMEOUT_S} s\nstdout:\n{out}\nstderr:\n{err[-5000:]}")

    assert proc.returncode == 0, f"{where} exited with {proc.returncode}\nstdout:\n{out}\nstderr:\n{err[-5000:]}"
    assert "Traceback (most recent call last)" not in err, f"{where} printed a traceback:\n{err[-5000:]}"
    if block.want is not None:
        checker = doctest.OutputChecker()
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        if not checker.check_output(block.want, out, flags):
            pytest.fail(
                f"{where} does not print what the README says it prints:\n"
                + checker.output_difference(doctest.Example("", block.want), out, flags)
            )
