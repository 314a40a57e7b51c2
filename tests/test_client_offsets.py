"""ConsumerOffsetManager: RocketMQ's consumerOffset.json layout, .bak, shared writes, periodic persist."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import localmq
from localmq.client.offsets import ConsumerOffsetManager
from localmq.store.config_json import read_config_json

REPO = Path(__file__).resolve().parent.parent


def test_written_in_rocketmq_layout(tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    m = ConsumerOffsetManager(str(path))
    v = m.commit("g", {("T", 0): 5, ("T", 1): 7, ("U", 3): 1})
    assert m.persist(v)
    text = path.read_text()
    assert text == '{\n\t"offsetTable":{\n\t\t"T@g":{0:5,1:7\n\t\t},\n\t\t"U@g":{3:1\n\t\t}\n\t}\n}'
    assert not m.persist(v)  # already written
    m.commit("g", {("T", 0): 6})
    m.persist()
    assert (tmp_path / "config" / "consumerOffset.json.bak").read_text() == text
    assert read_config_json(str(path))["offsetTable"]["T@g"] == {0: 6, 1: 7}


def test_loads_and_keeps_other_groups(tmp_path):
    path = tmp_path / "consumerOffset.json"
    path.write_text('{"offsetTable":{"T@other":{0:250,1:3},"T@g":{0:1}},"dataVersion":{"counter":2}}')
    m = ConsumerOffsetManager(str(path))
    assert m.query("g", "T", 0) == 1 and m.query("other", "T", 1) == 3 and m.query("g", "T", 9) is None
    assert m.group_offsets("other") == {("T", 0): 250, ("T", 1): 3}
    m.commit("g", {("T", 0): 2})
    m.persist()
    doc = read_config_json(str(path))
    assert doc["offsetTable"] == {"T@g": {0: 2}, "T@other": {0: 250, 1: 3}}
    assert doc["dataVersion"] == {"counter": 2}


def test_group_offsets_do_not_mix_groups_sharing_a_suffix(tmp_path):
    m = ConsumerOffsetManager(None)
    m.commit("g", {("T", 0): 1})
    m.commit("xg", {("T", 0): 2})
    m.commit("g%c1", {("T", 0): 3})
    assert m.group_offsets("g") == {("T", 0): 1}
    assert m.group_offsets("g%c1") == {("T", 0): 3}
    assert not m.persist()  # nothing to write to


def test_concurrent_commits_share_writes(tmp_path):
    m = ConsumerOffsetManager(str(tmp_path / "o.json"))

    def worker(q):
        for i in range(50):
            m.persist(m.commit("g", {("T", q): i + 1}))

    ts = [threading.Thread(target=worker, args=(q,)) for q in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert read_config_json(str(tmp_path / "o.json"))["offsetTable"]["T@g"] == {q: 50 for q in range(4)}
    assert m.persists <= 200


def test_periodic_persist(tmp_path):
    path = tmp_path / "o.json"
    m = ConsumerOffsetManager(str(path), flush_interval_ms=20)
    m.start()
    try:
        m.commit("g", {("T", 0): 9})
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_config_json(str(path))["offsetTable"] == {"T@g": {0: 9}}
    finally:
        m.close()


def test_retention_reads_what_consumers_commit(tmp_path):
    # CleanService protects unconsumed messages by reading this file: the consumer's commit must be what it sees
    with localmq.open(tmp_path / "s", mapped_file_size_commit_log=1 << 20) as mq:
        p = mq.create_producer(queue_id=0)
        for _ in range(10):
            p.send("T", b"x")
        c = mq.create_consumer("g", "T")
        for _ in range(4):
            c.poll(5)
        c.commit()
        bounds = mq.clean_service.commit_log_service.consumer_bounds()
        assert read_config_json(mq.offset_store_path)["offsetTable"] == {"T@g": {0: 4}}
        assert [(b.group, b.queue_id, b.queue_offset) for b in bounds] == [("T@g", 0, 4)]


def test_an_offset_that_is_not_an_integer_is_a_typed_error_naming_the_entry(tmp_path):
    """Issue 23/24: ``null`` as an offset made create_consumer, consumer_lag and ``localmq lag`` raise a bare
    TypeError. Now each raises CorruptStoreError (a ValueError) naming the file and the entry, and retention, which
    reads the same file, logs it and goes on; nothing rewrites the file."""
    root = tmp_path / "s"
    with localmq.open(root, mapped_file_size_commit_log=64 * 1024) as st:
        st.put("t", b"x")
        with st.create_consumer("g", "t") as c:
            assert c.poll(5) is not None
            c.commit()
    path = root / "config" / "consumerOffset.json"
    for bad in ("null", '"7"', "true", "1.5"):
        text = read_config_json(path)  # the document as written, then one offset replaced
        assert text["offsetTable"] == {"t@g": {0: 1}}
        raw = path.read_text().replace("0:1", f"0:{bad}")
        path.write_text(raw)
        with localmq.open(root) as st:
            for call in (lambda: st.create_consumer("g", "t"), lambda: st.consumer_lag("g")):
                with pytest.raises(localmq.CorruptStoreError) as e:
                    call()
                assert isinstance(e.value, ValueError)
                assert "consumerOffset.json" in str(e.value) and "'t@g'" in str(e.value) and "integer" in str(e.value)
        p = subprocess.run(
            [sys.executable, "-m", "localmq", "lag", str(root)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert p.returncode == 1 and "Traceback" not in p.stderr and "not an integer offset" in p.stderr, p.stderr
        assert path.read_text() == raw
        path.write_text(raw.replace(f"0:{bad}", "0:1"))
