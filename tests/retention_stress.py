"""Stress run for tests/test_store_retention.py: readers and a writer while retention deletes segments (a script).

``python tests/retention_stress.py DIR SECONDS`` exits 0 when every read was intact, 1 with the failures; a read of
an unmapped segment kills it with SIGSEGV, which is why the test runs it in a subprocess.
"""

import gc
import os
import sys
import threading
import time

import localmq
from localmq import GetStatus, PutStatus

SEG = 4096  # 10 records of 400 bytes per segment, as in test_store_retention.py
CQ_FILE = 200
BODY_LEN = 400 - (84 + 4 + 1 + 1 + 2)
TOPIC = "t"
MOVE = {GetStatus.FOUND, GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_FOUND_NULL, GetStatus.MESSAGE_WAS_REMOVING}
WAIT = {GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE}


def body(i):
    return (b"%06d" % i) * (BODY_LEN // 6) + b"#" * (BODY_LEN % 6)


class Clock:
    def __init__(self):
        self.ms = int(time.time() * 1000)

    def __call__(self):
        return self.ms


def main(root, seconds):
    # a switch every microsecond: the windows between a reader's checks and its use of the mapping open often
    sys.setswitchinterval(1e-5)
    clock = Clock()
    st = localmq.open(
        root,
        clock=clock,
        disk_usage=lambda path: 0.86,
        mapped_file_size_commit_log=SEG,
        mapped_file_size_consume_queue=CQ_FILE,
        clean_resource_interval=3_600_000,
        delete_commit_log_files_interval=0,
        delete_consume_queue_files_interval=0,
        redelete_hanged_file_interval=0,
        destroy_mapped_file_interval_forcibly=0,
        preallocate_mapped_file=False,
    )
    stop = threading.Event()
    failures = []
    counts = []

    def produce():
        i = 0
        try:
            while not stop.is_set():
                if st.max_offset(TOPIC, 0) - st.min_offset(TOPIC, 0) > 40:
                    time.sleep(0.0002)  # a short log: the readers stay in the segments retention deletes
                    continue
                assert st.put(TOPIC, body(i), queue_id=i % 2).status is PutStatus.PUT_OK
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)

    def read(zero_copy):
        kept, n = [], 0
        try:
            while not stop.is_set():
                for q in (0, 1):
                    # the oldest messages: the segment retention deletes next
                    g = st.get_message(TOPIC, q, st.min_offset(TOPIC, q), 8, zero_copy=zero_copy)
                    assert g.status in MOVE or g.status in WAIT, g
                    for m in g.messages:
                        i = int(bytes(m.body[:6]))
                        assert bytes(m.body) == body(i) and i % 2 == q, i
                    n += len(g.messages)
                    if zero_copy:
                        kept = (kept + [g])[-3:]  # views alive across clean passes
                    r = st.look_message_by_offset(g.messages[0].physical_offset) if g.messages else None
                    assert r is None or r.body == g.messages[0].body
            counts.append(n)
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    def collect():
        while not stop.is_set():  # collections at any allocation of the readers: finalizers switch threads
            gc.collect(0)
            time.sleep(0.0005)

    threads = [threading.Thread(target=produce), threading.Thread(target=collect)]
    threads += [threading.Thread(target=read, args=(z,)) for z in (False, True, False, True)]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and not failures:
            clock.ms += 1000
            st.clean_service.run_once()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        deleted = st.clean_service.stats()["deleted_commit_log_files"]
        st.close()
    print(f"read {sum(counts)} messages, deleted {deleted} segments")
    if failures:
        print("failures:", *[repr(e) for e in failures], sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(os.path.join(sys.argv[1], "s"), float(sys.argv[2])))
