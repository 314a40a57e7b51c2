"""Throughput of powerfs, to size power-cut workloads (figures in README.md beside this file).

    python tests/powerfs/bench.py [--dir DIR] [--mib 64] [--repeat 3]

1. sequential 4 KiB writes with an fsync every 64 writes (256 KiB), ``--mib`` MiB in all;
2. a 16 MiB file, mmap'd MAP_SHARED, every byte written, then msync(MS_SYNC);
3. one mount + cut + unmount cycle (what each crash of a crash loop costs), with 16 MiB unsynced.
Each is also run on the backing directory itself, for comparison.  The best of ``--repeat`` runs is printed.
"""

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from powerfs import PowerFS  # noqa: E402

PAGE = 4096


def seq_writes(path, mib):
    block = os.urandom(PAGE)
    count = mib * 1024 * 1024 // PAGE
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    start = time.perf_counter()
    for i in range(count):
        os.write(fd, block)
        if i % 64 == 63:
            os.fsync(fd)
    os.fsync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    os.unlink(path)
    return mib / elapsed


def mmap_write_msync(path, mib=16):
    size = mib * 1024 * 1024
    chunk = os.urandom(PAGE)
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o644)
    os.ftruncate(fd, size)
    os.fsync(fd)
    start = time.perf_counter()
    m = mmap.mmap(fd, size, mmap.MAP_SHARED)
    for off in range(0, size, PAGE):
        m[off : off + PAGE] = chunk
    m.flush()  # msync(MS_SYNC)
    elapsed = time.perf_counter() - start
    m.close()
    os.close(fd)
    os.unlink(path)
    return mib / elapsed


def cut_cycle(base, mib=16):
    disk, mnt = base / "cycle-disk", base / "cycle-mnt"
    start = time.perf_counter()
    with PowerFS(disk, mnt) as fs:
        fd = os.open(mnt / "f", os.O_CREAT | os.O_WRONLY, 0o644)
        block = bytes(1024 * 1024)
        for _ in range(mib):
            os.write(fd, block)
        os.close(fd)
        fs.cut("torn", 1)
    elapsed = time.perf_counter() - start
    shutil.rmtree(disk)
    shutil.rmtree(mnt)
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="where to make the backing directory and the mount point (default: a temp dir)")
    ap.add_argument("--mib", type=int, default=64, help="MiB of sequential writes")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="powerfs-bench-", dir=args.dir))
    try:
        raw = base / "raw"
        raw.mkdir()
        with PowerFS(base / "disk", base / "mnt") as fs:
            rows = [
                (
                    "4 KiB writes + fsync / 64 writes",
                    "MiB/s",
                    lambda: seq_writes(fs.mountpoint / "seq", args.mib),
                    lambda: seq_writes(raw / "seq", args.mib),
                ),
                (
                    "16 MiB mmap written + msync",
                    "MiB/s",
                    lambda: mmap_write_msync(fs.mountpoint / "map"),
                    lambda: mmap_write_msync(raw / "map"),
                ),
            ]
            results = [
                (name, unit, max(f() for _ in range(args.repeat)), max(g() for _ in range(args.repeat)))
                for name, unit, f, g in rows
            ]
        cycle = min(cut_cycle(base) for _ in range(args.repeat))
        print(f"{'workload':40} {'powerfs':>10} {'backing dir':>12}")
        for name, unit, on_fs, on_raw in results:
            print(f"{name:40} {on_fs:8.1f} {unit} {on_raw:8.1f} {unit}")
        print(f"{'mount + 16 MiB unsynced + torn cut':40} {cycle * 1000:8.0f} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
