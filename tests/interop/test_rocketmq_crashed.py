"""The CLI on a crashed RocketMQ store that nobody has recovered yet (issue 25 item 3).

RocketMQ 4.9.8's own DefaultMessageStore (StoreHarness `flood`) puts messages until it is SIGKILLed. The store it
leaves has the `abort` marker, a log that ends mid-segment and, made ahead of need by RocketMQ's
AllocateMappedFileService, a next segment that was never written. `localmq stats` and `localmq verify` read it as
it is: the log end they print must be the end that recovery finds, localmq's and RocketMQ's own, and the ordinary
torn tail (a record the kill cut short) is a note, not damage. Neither command changes a byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import localmq
from localmq.layout import INDEX_HEADER, INDEX_HEADER_SIZE, INDEX_ITEM_SIZE, INDEX_SLOT_SIZE
from localmq.store.index import geometry_from_content, infer_geometry

from .test_rocketmq_store import SIZES, harness, run_harness  # noqa: F401 - harness is a fixture

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> tuple[int, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-m", "localmq", *args, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode in (0, 1, 4) and r.stdout.strip(), (args, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return r.returncode, json.loads(r.stdout)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _flooded(cmd: list[str], store: Path) -> None:
    """RocketMQ puts until at least 2,000 messages (several 64 KiB segments) are in, then is SIGKILLed."""
    jtmp = store.parent / "java-tmp"
    jtmp.mkdir(parents=True, exist_ok=True)
    err = store.parent / "flood.stderr"  # a file, not a pipe nobody reads while the JVM runs (a full pipe blocks it)
    with open(err, "wb") as errf:
        proc = subprocess.Popen(
            [cmd[0], f"-Djava.io.tmpdir={jtmp}", *cmd[1:], "flood", str(store)],
            stdout=subprocess.PIPE,
            stderr=errf,
            text=True,
        )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("put ") and int(line.split()[1]) >= 2000:
                break
        else:
            raise AssertionError(f"StoreHarness flood ended ({proc.wait(60)}): {err.read_text()[-4000:]}")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert (store / "abort").exists()


def _empty_last(directory: Path) -> Path | None:
    """The last file of a directory of segments (the commit log's, a ConsumeQueue's) when it is empty: RocketMQ's
    allocation creates a file, then sizes it, and a kill between leaves it so."""
    files = sorted(directory.iterdir())
    return files[-1] if files and files[-1].stat().st_size == 0 else None


def _recovered_ends(cmd: list[str], store: Path, tmp: Path) -> tuple[int, int]:
    """(localmq's recovery end, RocketMQ's), each on a copy of the store. RocketMQ 4.9.8's load refuses a store whose
    last segment is empty; its copy goes without that file, as RocketMQ 5's load deletes it."""
    mine, theirs, out = tmp / "mine", tmp / "theirs", tmp / "read.json"
    shutil.copytree(store, mine)
    shutil.copytree(store, theirs)
    # the same for a ConsumeQueue's empty last file (the same load code, the same allocation)
    for d in [theirs / "commitlog", *(theirs / "consumequeue").glob("*/*")]:
        empty = _empty_last(d)
        if empty is not None:
            empty.unlink()
    with localmq.open(mine, **SIZES) as st:
        assert st.recovery.mode == "abnormal"
        end = st.recovery.end_offset
        assert st.wait_for_dispatch(30)
    run_harness(cmd, "read", str(theirs), str(out))
    shutil.rmtree(mine)
    shutil.rmtree(theirs)
    return end, json.loads(out.read_text(encoding="utf-8"))["maxPhyOffset"]


def _check_cli(cmd: list[str], store: Path, tmp: Path, torn_at: int | None) -> None:
    before = _digest(store)
    code, stats = _cli("stats", str(store))
    assert code == 0, stats
    vcode, verify = _cli("verify", str(store))
    assert _digest(store) == before, "stats / verify changed a file"
    mine, theirs = _recovered_ends(cmd, store, tmp)
    assert stats["commit_log"]["end"] == mine == theirs, (stats["commit_log"], mine, theirs)
    assert stats["dispatch"]["behind_bytes"] == mine - stats["dispatch"]["dispatched_end"]
    assert vcode == 0 and verify["ok"], verify
    torn = [n for n in verify["notes"] if "torn record at the end of the data" in n]
    empty = _empty_last(store / "commitlog")
    assert (empty is not None) == any(
        f"{empty} is empty: the creation of the last segment" in n for n in verify["notes"]
    )
    if torn_at is not None:
        assert mine == theirs == torn_at
        assert torn and f"offset {torn_at:,}:" in torn[0], verify["notes"]


def test_cli_on_a_crashed_rocketmq_store_prints_what_recovery_finds(harness: list[str], tmp_path: Path) -> None:  # noqa: F811
    """As the kill left it (with whatever tail it cut), then with a torn last record: half of a record RocketMQ
    wrote, copied after the end of the log (what a kill in the middle of a put's copy leaves)."""
    store = tmp_path / "store"
    _flooded(harness, store)
    segments = sorted((store / "commitlog").iterdir())
    assert len(segments) >= 3, segments
    _check_cli(harness, store, tmp_path, None)

    seg_size = SIZES["mapped_file_size_commit_log"]
    made_empty = None
    if _empty_last(store / "commitlog") is None:
        # what the kill leaves when it lands inside RocketMQ's allocator (one run in a few): an empty next segment
        made_empty = store / "commitlog" / f"{int(segments[-1].name) + seg_size:020d}"
        made_empty.touch()
        _check_cli(harness, store, tmp_path, None)
    # the reason _recovered_ends deletes the empty segment from RocketMQ's copy: 4.9.8's own load refuses the store
    copy = tmp_path / "refused"
    shutil.copytree(store, copy)
    r = subprocess.run(
        [harness[0], f"-Djava.io.tmpdir={tmp_path / 'java-tmp'}", *harness[1:], "read", str(copy), str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "DefaultMessageStore.load() failed" in r.stderr, (r.returncode, r.stderr[-2000:])
    shutil.rmtree(copy)
    if made_empty is not None:
        made_empty.unlink()
    # the same inside a ConsumeQueue's allocation: an empty next file of one queue
    qdir = sorted((store / "consumequeue").glob("*/*"))[0]
    qfiles = sorted(qdir.iterdir())
    empty_unit_file = qdir / f"{int(qfiles[-1].name) + qfiles[-1].stat().st_size:020d}"
    empty_unit_file.touch()
    _check_cli(harness, store, tmp_path, None)
    empty_unit_file.unlink()

    # what the kill leaves when it lands between an index item's write and the header's count (RocketMQ's putKey
    # writes the item and its slot first): verify notes it in a store that exited uncleanly, the open rebuilds it
    idx = sorted((store / "index").iterdir())[-1]
    kept = idx.read_bytes()
    slots, items = geometry_from_content(str(idx)) or infer_geometry(len(kept))
    count = INDEX_HEADER.unpack_from(kept, 0)[5]
    at = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + count * INDEX_ITEM_SIZE
    assert count < items
    if kept[at:] == bytes(len(kept) - at):
        idx.write_bytes(kept[:at] + kept[at - INDEX_ITEM_SIZE : at] + kept[at + INDEX_ITEM_SIZE :])
    else:  # the kill itself landed there (CI, 2026-11-29): one item past the count, nothing after it
        assert kept[at + INDEX_ITEM_SIZE :] == bytes(len(kept) - at - INDEX_ITEM_SIZE), count
    _check_cli(harness, store, tmp_path, None)
    _, verify = _cli("verify", str(store))
    assert any(n.startswith(f"index file {idx}: one key's item past the header's count") for n in verify["notes"])
    idx.write_bytes(kept)

    code, stats = _cli("stats", str(store))
    end = stats["commit_log"]["end"]
    first = (store / "commitlog" / f"{0:020d}").read_bytes()
    record = first[: int.from_bytes(first[:4], "big")]  # a whole record RocketMQ wrote
    seg = store / "commitlog" / f"{end - end % seg_size:020d}"  # made ahead by RocketMQ if ``end`` starts it
    assert seg.exists() and end % seg_size + len(record) <= seg_size, (end, len(record))
    if seg.stat().st_size == 0:  # ``end`` starts the segment the kill left empty: sized, as RocketMQ's allocator ends
        os.truncate(seg, seg_size)
    with open(seg, "r+b") as f:
        f.seek(end % seg_size)
        f.write(record[: len(record) // 2])
    _check_cli(harness, store, tmp_path, end)
    shutil.rmtree(store)
