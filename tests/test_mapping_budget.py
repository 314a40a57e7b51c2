"""The budget of mapped ConsumeQueue files (issue 27, ``max_mapped_queue_files``) under concurrency.

A store with the smallest budget (16 mapped queue files) and small queue files (16 units) takes puts to 120 queues
from 3 threads while 3 reader threads pull random queues, a consumer group reads every queue, the ConsumeQueue
flush runs every 5 ms: files are unmapped and mapped again all the time, by the dispatcher (write targets), by
readers and by the flush. It runs in a child process, so a use of an unmapped file
(SIGSEGV or SIGBUS) fails the test instead of killing pytest. Expectations: every message each reader got is
byte for byte the one put at its queue offset (bodies name their topic, queue and offset, with a CRC), the consumer
group gets every message put exactly once and in order, the mapped queue files exceed the budget only by the files in
use at one moment (at most twice the budget here), every mapped queue file is one the budget counts, and evictions
and re-maps did happen.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import json, random, sys, threading, time, zlib
    import localmq
    from localmq import PutStatus

    root, shared = sys.argv[1], sys.argv[2] == "shared"
    TOPICS, QUEUES, PER_QUEUE, BUDGET = 30, 4, 60, 16
    st = localmq.open(root, shared=shared, max_mapped_queue_files=BUDGET, mapped_file_size_consume_queue=20 * 16,
                      mapped_file_size_commit_log=64 * 1024, flush_interval_consume_queue=5,
                      flush_interval_commit_log=5)
    problems, stats = [], {"reads": 0, "maps": 0}
    stop = threading.Event()

    def body(t, q, i):
        b = b"t%d/q%d/%d:" % (t, q, i) + bytes([(t + q + i) % 251]) * ((t * 13 + i) % 90)
        return b + zlib.crc32(b).to_bytes(4, "big")

    def maps():
        with open("/proc/self/maps") as f:
            return sum("/consumequeue/" in line for line in f)

    def writer(k):
        # queue (t, q) gets its messages in order from one thread: its queue offset i is the body's i
        mine = [(t, q) for t in range(TOPICS) for q in range(QUEUES) if (t * QUEUES + q) % 3 == k]
        for i in range(PER_QUEUE):
            for t, q in mine:
                r = st.put("t%d" % t, body(t, q, i), queue_id=q)
                if r.status is not PutStatus.PUT_OK or r.queue_offset != i:
                    problems.append("put t%d/q%d/%d: %s at %s" % (t, q, i, r.status.name, r.queue_offset))

    def reader(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            t, q = rng.randrange(TOPICS), rng.randrange(QUEUES)
            lo = st.min_offset("t%d" % t, q)
            hi = st.max_offset("t%d" % t, q)
            if hi <= lo:
                continue
            off = rng.randrange(lo, hi)
            try:
                r = st.get_message("t%d" % t, q, off, 8)
            except localmq.LocalMQError as e:
                problems.append("get t%d/q%d@%d: %r" % (t, q, off, e))
                continue
            for m in r.messages:
                if bytes(m.body) != body(t, q, m.queue_offset):
                    problems.append("t%d/q%d@%d: %r" % (t, q, m.queue_offset, bytes(m.body)[:40]))
            stats["reads"] += len(r.messages)
            stats["maps"] = max(stats["maps"], maps())

    readers = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
    writers = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for th in readers + writers:
        th.start()
    for th in writers:
        th.join()
    if not st.wait_for_dispatch(120):
        problems.append("dispatch did not finish")
    time.sleep(0.2)
    stop.set()
    for th in readers:
        th.join()
    seen = {}
    c = st.create_consumer("G", ["t%d" % t for t in range(TOPICS)], from_offset="earliest")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sum(len(v) for v in seen.values()) >= TOPICS * QUEUES * PER_QUEUE:
            break
        batch = c.poll_batch(64, timeout=0.2)
        for m in batch:
            key = (m.topic, m.queue_id)
            t, q = int(m.topic[1:]), m.queue_id
            if bytes(m.body) != body(t, q, m.queue_offset):
                problems.append("consumer %s/%d@%d: wrong body" % (m.topic, q, m.queue_offset))
            seen.setdefault(key, []).append(m.queue_offset)
            stats["maps"] = max(stats["maps"], maps())
        c.commit()
    for key, offs in seen.items():
        if offs != list(range(PER_QUEUE)):
            problems.append("consumer %s: offsets %s..%s, %d of them" % (key, offs[0], offs[-1], len(offs)))
    if len(seen) != TOPICS * QUEUES:
        problems.append("consumer saw %d queues" % len(seen))
    # at rest (nothing maps now), every queue file the process maps is one the budget counts: a mapping made by
    # two threads at once, or one left behind by an eviction, would be in /proc/self/maps only
    stats["rest_maps"] = maps()
    s = st.stats()
    stats.update(consumed=sum(len(v) for v in seen.values()), evictions=s["queue_file_evictions"],
                 remaps=s["queue_file_remaps"], mapped=s["mapped_queue_files"], budget=BUDGET)
    c.close()
    st.close()
    print(json.dumps({"problems": problems[:20], "stats": stats}), flush=True)
""")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_files_unmapped_and_mapped_again_under_load_lose_and_mix_up_nothing(tmp_path, mode):
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "store"), mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-4000:]}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["problems"] == [], out
    s = out["stats"]
    assert s["reads"] > 0 and s["consumed"] > 0, s
    # the readers, the consumer and the dispatcher all made the budget unmap files and map them again
    assert s["evictions"] > 100 and s["remaps"] > 100, s
    # no mapping the budget does not know about (the CI run on 5043b60 found 20 leaked ones: two threads mapping the
    # same evicted file at once each kept a mapping)
    assert s["rest_maps"] == s["mapped"], s
    # the budget can be exceeded only by files in use at that moment: each reader's and the flush's current file,
    # write targets mapped since the dispatcher's last trim, a mapping made by a thread that lost the race to map
    # the same file (measured after the leak's fix: 19 to 20 for a budget of 16 on a quiet machine)
    assert 0 < s["maps"] <= 2 * s["budget"], s


def test_an_existing_file_of_a_budget_is_mapped_on_first_use(tmp_path):
    # MappedFileQueue.load opens a budget's files unmapped (map_now=False): a store of more queues than its budget
    # no longer maps every file at open only to unmap most of them again
    from localmq._mapped_file import MappedFile
    from localmq._mapping import MappingBudget
    from localmq.errors import CorruptStoreError, StoreClosedError

    path = tmp_path / "00000000000000000000"
    mf = MappedFile(path, 4096, create=True, keep_fd=False)
    mf.write_at(100, b"unit")
    mf.flush()
    mf.close()
    budget = MappingBudget(16)
    lazy = MappedFile(path, 4096, create=False, keep_fd=False, budget=budget, map_now=False)
    assert budget.mapped == 0 and budget.remaps == 0
    assert lazy.read(100, 4) == b"unit"  # mapped now
    assert budget.mapped == 1 and budget.remaps == 1
    lazy.close()
    assert budget.mapped == 0
    with pytest.raises(ValueError, match="map_now=False"):
        MappedFile(path, 4096, create=False, keep_fd=False, map_now=False)  # no budget
    with pytest.raises(ValueError, match="map_now=False"):
        MappedFile(path, 4096, create=True, keep_fd=False, budget=budget, map_now=False)
    with pytest.raises(CorruptStoreError, match="8192"):
        MappedFile(path, 8192, create=False, keep_fd=False, budget=budget, map_now=False)
    with pytest.raises(FileNotFoundError):
        MappedFile(tmp_path / "00000000000000004096", 4096, create=False, keep_fd=False, budget=budget, map_now=False)
    # a deferred file that is never used closes cleanly, and a name that another file took is refused at first use
    lazy = MappedFile(path, 4096, create=False, keep_fd=False, budget=budget, map_now=False)
    os.replace(tmp_path / "00000000000000000000", tmp_path / "old")
    (tmp_path / "00000000000000000000").write_bytes(bytes(4096))
    with pytest.raises(StoreClosedError):  # as for a file retention deleted under a reader
        lazy.read(100, 4)
    lazy.close()
