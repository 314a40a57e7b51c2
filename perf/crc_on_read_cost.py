"""get throughput with check_crc_on_read on and off (same store, reopened; best of 5 passes each)."""
import sys, time, tempfile, os, localmq
size = int(sys.argv[1]) if len(sys.argv) > 1 else 100
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
root = tempfile.mkdtemp(prefix="crcbench", dir=None)
with localmq.open(root, mapped_file_size_commit_log=256 << 20) as st:
    body = os.urandom(size)
    for i in range(0, n, 32):
        st.put_batch("t", [body] * 32)
    st.wait_for_dispatch(60)
def run(check):
    best = 1e9
    with localmq.open(root, mapped_file_size_commit_log=256 << 20, check_crc_on_read=check) as st:
        for _ in range(5):
            t0 = time.perf_counter(); off = 0; got = 0
            while True:
                r = st.get_message("t", 0, off, 32)
                if not r.messages: break
                got += len(r.messages); off = r.next_begin_offset
            best = min(best, time.perf_counter() - t0)
    return got / best
for _ in range(2):
    off_ = run(False); on = run(True)
    print(f"body {size} B, {n} msgs: crc off {off_:,.0f} msg/s, crc on {on:,.0f} msg/s, cost {100 * (1 - on / off_):.1f}%")
