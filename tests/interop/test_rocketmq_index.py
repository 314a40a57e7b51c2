"""The IndexFile with each side's default settings (issue 25): RocketMQ 4.9.8's DefaultMessageStore finds every key
localmq indexed, localmq finds every key RocketMQ indexed, before and after the other side opened the store.

Only the commit log and ConsumeQueue sizes are the harness's small ones (StoreHarness.java); the index geometry is
left to each side's defaults (the harness runs with ``-Dlocalmq.interop.index=default``: RocketMQ's 5,000,000 slots
and 20,000,000 items, a 420,000,040-byte file, sparse on both sides).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import localmq

from .test_rocketmq_store import harness, run_harness  # noqa: F401 - harness is a fixture

SIZES = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 300}
ROCKETMQ_INDEX_FILE = 40 + 5_000_000 * 4 + 20_000_000 * 20


def default_index(cmd: list[str]) -> list[str]:
    return [cmd[0], "-Dlocalmq.interop.index=default", *cmd[1:]]


def index_files(store: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted((store / "index").iterdir())}


def disk_kib(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def test_keys_localmq_indexed_with_its_defaults_are_found_by_rocketmq_with_its_defaults(harness, tmp_path):  # noqa: F811
    store, out = tmp_path / "store", tmp_path / "read.json"
    offsets = {}
    with localmq.open(store, **SIZES) as st:
        for i in range(2000):
            r = st.put(("orders", "audit_log-1")[i % 2], b"m%d" % i, queue_id=i % 4, keys=[f"key-{i}"])
            offsets[(("orders", "audit_log-1")[i % 2], f"key-{i}")] = r.physical_offset
        assert st.wait_for_index(60)
    files = index_files(store)
    assert list(files.values()) == [ROCKETMQ_INDEX_FILE], files  # RocketMQ's geometry by default
    assert disk_kib(store / "index") < 4096  # sparse: the pages the 2,000 keys touched
    queries = [a for (topic, key) in offsets for a in (topic, key)]
    run_harness(default_index(harness), "read", str(store), str(out), *queries)
    found = json.loads(out.read_text(encoding="utf-8"))["queried"]
    missing = [k for k, off in offsets.items() if off not in found[f"{k[0]}/{k[1]}"]]
    assert not missing, f"RocketMQ found {len(offsets) - len(missing)} of {len(offsets)} keys, {missing[:3]} not"
    assert index_files(store) == files  # RocketMQ neither grew nor replaced the file
    with localmq.open(store, **SIZES) as st:  # and localmq still finds its own keys after RocketMQ's load/shutdown
        assert st.wait_for_index(60)
        lost = [k for k, off in offsets.items() if off not in [m.physical_offset for m in st.query_message(*k)]]
        assert not lost, f"{len(lost)} keys lost after RocketMQ opened the store, first {lost[:3]}"


def test_keys_rocketmq_indexed_with_its_defaults_are_found_by_localmq_with_its_defaults(harness, tmp_path):  # noqa: F811
    store, manifest = tmp_path / "store", tmp_path / "manifest.json"
    run_harness(default_index(harness), "write", str(store), str(manifest), "7")
    written = json.loads(manifest.read_text(encoding="utf-8"))
    assert written["maxHashSlotNum"] == 5_000_000 and written["maxIndexNum"] == 20_000_000
    queried = written["queried"]
    assert len(queried) > 50 and all(queried.values())
    before = index_files(store)
    assert set(before.values()) == {ROCKETMQ_INDEX_FILE}, before
    with localmq.open(store, **SIZES) as st:
        assert st.wait_for_index(60)
        assert index_files(store) == before  # kept as RocketMQ wrote them: same names, same geometry
        wrong = {}
        for name, offs in queried.items():
            topic, key = name.split("/", 1)
            got = sorted(m.physical_offset for m in st.query_message(topic, key))
            if got != sorted(offs):
                wrong[name] = (got, offs)
        assert not wrong, f"{len(wrong)} of {len(queried)} keys differ: {list(wrong.items())[:3]}"
        # localmq appends: its new keys go into RocketMQ's file, findable by both
        extra = {
            f"after-{i}": st.put("orders", b"after %d" % i, keys=[f"after-{i}"]).physical_offset for i in range(300)
        }
        assert st.wait_for_index(60)
    assert set(index_files(store).values()) == {ROCKETMQ_INDEX_FILE}
    out = tmp_path / "read.json"
    run_harness(
        default_index(harness),
        "read",
        str(store),
        str(out),
        *[a for k in extra for a in ("orders", k)],
        *[a for n in list(queried)[:50] for a in n.split("/", 1)],
    )
    found = json.loads(out.read_text(encoding="utf-8"))["queried"]
    missing = [k for k, off in extra.items() if off not in found[f"orders/{k}"]]
    assert not missing, f"RocketMQ found {len(extra) - len(missing)} of {len(extra)} keys localmq added"
    old = [n for n in list(queried)[:50] if sorted(found[n]) != sorted(queried[n])]
    assert not old, old[:3]


def test_a_store_rocketmq_indexed_with_another_geometry_keeps_it_both_ways(harness, tmp_path):  # noqa: F811
    """A broker configured with 97 slots and 1,003 items (not RocketMQ's ratio of 4: the size alone fits many
    geometries): localmq keeps its files (it used to delete them), reads them, records the geometry, and its new
    files have it, so the broker finds every key localmq added too."""
    geometry = "-Dlocalmq.interop.index=97/1003"
    size = 40 + 97 * 4 + 1003 * 20
    cmd = [harness[0], geometry, *harness[1:]]
    store, manifest = tmp_path / "store", tmp_path / "manifest.json"
    run_harness(cmd, "write", str(store), str(manifest), "8")
    queried = json.loads(manifest.read_text(encoding="utf-8"))["queried"]
    before = index_files(store)
    assert before and set(before.values()) == {size}, before
    with localmq.open(store, **SIZES) as st:  # no index setting: the geometry is read off the files
        assert (st.config.max_hash_slot_num, st.config.max_index_num) == (97, 1003)
        assert st.wait_for_index(60)
        assert set(before) <= set(index_files(store))  # none deleted
        wrong = [
            n
            for n, offs in queried.items()
            if sorted(m.physical_offset for m in st.query_message(*n.split("/", 1))) != sorted(offs)
        ]
        assert not wrong, f"{len(wrong)} of {len(queried)} keys differ, first {wrong[:3]}"
        extra = {
            f"more-{i}": st.put("orders", b"more %d" % i, keys=[f"more-{i}"]).physical_offset for i in range(2500)
        }  # more than two files of 1,003 items: localmq rolls
        assert st.wait_for_index(60)
    after = index_files(store)
    assert len(after) >= len(before) + 2 and set(after.values()) == {size}, after
    with localmq.open(store) as st:  # recorded: a later open without the settings has them
        assert (st.config.max_hash_slot_num, st.config.max_index_num) == (97, 1003)
    out = tmp_path / "read.json"
    sample = list(extra)[::25]
    run_harness(cmd, "read", str(store), str(out), *[a for k in sample for a in ("orders", k)])
    found = json.loads(out.read_text(encoding="utf-8"))["queried"]
    missing = [k for k in sample if extra[k] not in found[f"orders/{k}"]]
    assert not missing, f"RocketMQ found {len(sample) - len(missing)} of {len(sample)} keys localmq added"
