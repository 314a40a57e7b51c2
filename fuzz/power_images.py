"""Power-cut images for fuzz_open_store: stores as a power cut left them, made on the power-cut file system of
tests/powerfs (issue 24, item 5: "add power-cut images as seeds").

``images(config, bodies)`` returns the directories of ``COUNT`` stores, each written on a powerfs mount by putting
``bodies`` in order (SYNC_FLUSH or ASYNC_FLUSH, flushes every 10 or 200 ms), with the power cut (``all``, ``random``
or ``torn``: unsynced pages and directory entries lost, kept or torn) after a seeded number of them: the writing
process is SIGKILLed while the store's threads (dispatch, flushes, allocation ahead) work, then the power is cut;
what the backing directory then holds is the image.
They are made once per machine and cached (``LOCALMQ_FUZZ_POWER_DIR``, default ``~/.cache/localmq-fuzz-power``,
one subdirectory per version of this recipe and of the store it is given, made under a lock so that parallel fuzz
jobs share one); building and mounting powerfs needs fuse3 and libfuse3-dev (tests/powerfs/README.md). A failure to
build them raises: the target never runs without its seeds.
"""

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

COUNT = 12
MODES = ("all", "random", "torn")
_RECIPE = 3  # bump when the way images are made changes


def _cache_root():
    return os.environ.get("LOCALMQ_FUZZ_POWER_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "localmq-fuzz-power"
    )


_WRITER = r"""
import json, random, sys, time
import localmq
root, cfg, bodies_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[5]
n, cut_at = int(sys.argv[3]), int(sys.argv[4])
with open(bodies_path, "rb") as f:
    bodies = json.loads(f.read())
rng = random.Random(f"power-image/{n}/writer")
st = localmq.open(root, **cfg)
for i, body in enumerate(bodies):
    if i == cut_at:
        break
    st.put(("a", "b", "c")[i % 3], bytes.fromhex(body), queue_id=i % 2, keys=f"k{i}" if i % 5 == 0 else None)
    if rng.random() < 0.02:
        time.sleep(rng.uniform(0.001, 0.05))  # let a flush interval pass now and then
print("cut", flush=True)
time.sleep(600)  # SIGKILLed here by the builder, with the store's threads at work
"""


def _make_one(PowerFS, base, config, bodies, n):
    """Write the n-th image into ``base/disk`` (the powerfs backing directory) and return that directory.

    The store is written by a child process, SIGKILLed (and waited for) once it has put ``cut_at`` messages, while
    its threads (dispatch, flushes, allocation ahead) are at work; then the power is cut, as PowerFS requires (a
    process still running at the cut would meet EIO on the mount, and a fault on a mapped page there is a SIGBUS:
    CI saw this builder, when it cut under its own running store, die so once)."""
    rng = random.Random(f"power-image/{n}")
    disk, mnt = os.path.join(base, "disk"), os.path.join(base, "mnt")
    os.makedirs(disk)
    cfg = dict(
        config,
        flush_disk_type=rng.choice(["SYNC_FLUSH", "ASYNC_FLUSH"]),
        flush_interval_consume_queue=rng.choice([10, 200]),
        flush_interval_commit_log=rng.choice([10, 200]),
    )
    cut_at = rng.randrange(1, len(bodies))
    bodies_path = os.path.join(base, "bodies.json")
    with open(bodies_path, "w") as f:
        json.dump([b.hex() for b in bodies], f)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    fs = PowerFS(disk, mnt)
    fs.mount()
    try:
        args = [sys.executable, "-c", _WRITER, os.path.join(mnt, "store"), json.dumps(cfg), str(n), str(cut_at)]
        proc = subprocess.Popen(args + [bodies_path], stdout=subprocess.PIPE, env=env)
        try:
            line = proc.stdout.readline()
        finally:
            proc.kill()
            proc.wait(60)
            proc.stdout.close()
        if line.strip() != b"cut":
            raise RuntimeError(f"power image {n}: the writer exited ({proc.returncode}) before the cut")
        fs.cut(MODES[n % len(MODES)], rng.randrange(1 << 31))
    finally:
        fs.unmount()
    return os.path.join(disk, "store")


def images(config, bodies):
    """The directories of the power-cut images (made and cached on first use)."""
    key = hashlib.sha256(
        json.dumps([_RECIPE, COUNT, sorted(config.items()), hashlib.sha256(b"".join(bodies)).hexdigest()]).encode()
    ).hexdigest()[:16]
    cache = os.path.join(_cache_root(), key)
    done = os.path.join(cache, "done")
    if not os.path.exists(done):
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(done):
                _build(cache, config, bodies)
    return sorted(os.path.join(cache, d) for d in os.listdir(cache) if d.startswith("image-"))


def _build(cache, config, bodies):
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.join(os.path.dirname(here), "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from powerfs import PowerFS

    for d in os.listdir(cache):
        if d.startswith("image-"):
            shutil.rmtree(os.path.join(cache, d))
    for n in range(COUNT):
        base = tempfile.mkdtemp(prefix="localmq-fuzz-power-")
        try:
            store = _make_one(PowerFS, base, config, bodies, n)
            if os.path.isdir(store):  # a cut may take the store's directory entry itself
                shutil.copytree(store, os.path.join(cache, f"image-{n:02d}"), symlinks=True)
            else:
                os.makedirs(os.path.join(cache, f"image-{n:02d}"))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    open(os.path.join(cache, "done"), "w").close()
