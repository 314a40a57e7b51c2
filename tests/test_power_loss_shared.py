"""Power cuts of a store shared between processes (issue 24): ext4 on a loop device whose image lies on powerfs.

A shared store (``shared=True``) refuses FUSE mounts (its robust mutexes and byte locks need a local file system),
so the power cut is taken one layer down: a fresh ext4 image (made once per module, copied sparse for each cut)
lies on a powerfs mount, a loop device maps it, and the store lives on that ext4. ext4 makes its writes durable
with cache flushes, which the loop driver turns into fsyncs of the image file, which reach powerfs as FSYNC: the
image on powerfs's backing directory then holds exactly what ext4 made durable, as a disk with a volatile write
cache would. ``cut(mode)`` drops the rest (``all``), or a random part of it (``random``, ``torn``: whole or torn
4 KiB pages of the image, which ext4's journal checksums must catch), the loop device and ext4 are taken down, and
the image is mounted again from the backing directory (ext4 replays its journal) and the store opened and checked.

Each cut runs two writer processes of tests/power_writer.py (sessions 1 and 2) on one store at once, from 1-3
threads each, SIGKILLed at the same seeded moment before the cut; in about 30% of the cuts two more (sessions 3 and 4)
then open the cut store at once (recovery through the replayed file system), are killed at a seeded moment, often
during the open, and the power is cut again; the checks are those of tests/test_power_loss.py
(``check``) with the sessions' messages allowed to interleave: SYNC_FLUSH loses no acknowledged message, ASYNC_FLUSH
none below the flushed offset a writer reported, every message found was put, once, in order per writer thread,
queues are dense, keys are found, the committed offsets of the consumer (session 1) are durable and never ahead of
what survived, and new puts get the next offsets.

``LOCALMQ_SHARED_POWER_CUTS=N`` runs N cuts in all (default 12); ``LOCALMQ_POWER_SEED=S`` replays one seed. Needs
root (losetup, mount); a missing tool or a refused loop device fails the test, never skips it.
"""

import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import test_power_loss as pl
from test_power_loss import FLUSHES, MODES, Session, WriterServer, check, mounted, settings

TOTAL_CUTS = int(os.environ.get("LOCALMQ_SHARED_POWER_CUTS", "12"))
CUTS_PER_TEST = max(1, -(-TOTAL_CUTS // (len(FLUSHES) * len(MODES))))
IMAGE_MB = 96

pytestmark = pytest.mark.timeout(max(300, CUTS_PER_TEST * 20))


def _run(*cmd, check_rc=True, timeout=60):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        pytest.fail(f"{cmd[0]} is needed for the shared-store power cuts (util-linux, e2fsprogs): {e}", pytrace=False)
    if check_rc and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()}")
    return r


class Ext4:
    """ext4 of the image ``image`` mounted on ``where`` through a loop device; ``down()`` takes both away."""

    def __init__(self, image, where):
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        r = _run("losetup", "-f", "--show", str(image), check_rc=False)
        if r.returncode != 0:
            pytest.fail(
                f"no loop device for the shared-store power cuts (run as root): {r.stderr.strip()}", pytrace=False
            )
        self.dev = r.stdout.strip()
        try:
            _run("mount", "-t", "ext4", self.dev, str(where))
        except BaseException:
            _run("losetup", "-d", self.dev, check_rc=False)
            raise

    def down(self):
        """Unmount (after a cut, ext4's write-back fails with EIO: the unmount still succeeds) and detach."""
        for _ in range(50):
            if _run("umount", str(self.where), check_rc=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            _run("umount", "-l", str(self.where), check_rc=False)
        for _ in range(50):
            if _run("losetup", "-d", self.dev, check_rc=False).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"loop device {self.dev} could not be detached")


@pytest.fixture(scope="module")
def shared_dir():
    """The cuts' directories (/dev/shm when writable, as test_power_loss's) and a fresh ext4 image in them."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    d = Path(tempfile.mkdtemp(prefix="localmq-shared-power-", dir=parent))
    image = d / "pristine.img"
    with open(image, "wb") as f:
        f.truncate(IMAGE_MB << 20)
    # every block group initialised now: no lazy-init thread writing into the image during a cut
    _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def servers():
    out = [WriterServer(), WriterServer()]
    yield out
    for s in out:
        s.close()


def _run_sessions(servers, jobs, kill_after, first=1, from_ready=True):
    """Both writers at once; each SIGKILLed ``kill_after`` s after it reported its open (``from_ready``) or after its
    start (then often during the open's recovery). Returns the Sessions, numbered from ``first``."""
    results, errors = [None] * len(jobs), []

    def one(n):
        try:
            results[n] = servers[n].run(jobs[n], kill_after, from_ready=from_ready, timeout=60.0)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [Session(first + n, jobs[n], *results[n]) for n in range(len(jobs))]


def _jobs(rng, ext, cfg, seed, first):
    """The two writers' jobs, sessions ``first`` and ``first + 1``; only the first runs the consumer group (its
    commits are checked). Under SYNC_FLUSH session 1 also puts delayed messages and sends messages back for retries
    (power_writer's ``special: "delay"``)."""
    jobs = []
    for n in (first, first + 1):
        job = pl.job_for(rng, ext / "store", cfg, seed, n)
        job["consumer"] = n == first and job["consumer"]
        if n == 1 and cfg["flush_disk_type"] == "SYNC_FLUSH":
            job["special"] = "delay"
        jobs.append(job)
    return jobs


def run_shared_cut(servers, base, flush, mode, seed, figures):
    rng = random.Random(f"shared/{flush}/{mode}/{seed}")
    disk, mnt, ext = base / "disk", base / "mnt", base / "ext"
    shutil.rmtree(disk, ignore_errors=True)
    disk.mkdir(parents=True)
    _run("cp", "--sparse=always", str(base.parent / "pristine.img"), str(disk / "fs.img"))
    cfg = dict(settings(rng, flush), shared=True)
    t0 = time.monotonic()
    fs = mounted(disk, mnt)
    try:
        fsys = Ext4(mnt / "fs.img", ext)
        try:
            sessions = _run_sessions(servers, _jobs(rng, ext, cfg, seed, 1), rng.uniform(0.05, 0.6))
            fs.cut(mode, rng.randrange(1 << 31))
        finally:
            fsys.down()
    finally:
        fs.unmount()
    if rng.random() < 0.3:
        # recovery through the cut file system (its journal replayed), two processes attaching at once, both
        # killed at a seeded moment (often during the open), cut again
        figures["recuts"] += 1
        fs = mounted(disk, mnt)
        try:
            fsys = Ext4(mnt / "fs.img", ext)
            try:
                sessions += _run_sessions(
                    servers, _jobs(rng, ext, cfg, seed, 3), rng.uniform(0.0, 0.8), first=3, from_ready=False
                )
                fs.cut(mode, rng.randrange(1 << 31))
            finally:
                fsys.down()
        finally:
            fs.unmount()
    fsys = Ext4(disk / "fs.img", ext)  # ext4 replays its journal here
    try:
        check(ext / "store", cfg, flush, seed, sessions, figures, concurrent=True)
        if sessions[0].job.get("special"):
            # every acknowledged delayed message delivered once, every returned send-back retried once
            pl._check_special(ext / "store", cfg, seed, sessions[0].job, sessions[0].lines, figures)
    finally:
        fsys.down()
    figures["cuts"] += 1
    figures["seconds"] += time.monotonic() - t0
    figures["per_cut"].append(time.monotonic() - t0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flush", FLUSHES)
def test_shared_store_power_cuts(servers, shared_dir, tmp_path, flush, mode):
    base = shared_dir / f"{flush}-{mode}"

    def kept_disk():
        if not (base / "disk" / "fs.img").exists():
            return ""
        shutil.copy(base / "disk" / "fs.img", tmp_path / "fs.img")
        return f"; the ext4 image is kept in {tmp_path / 'fs.img'}"

    pl.run_cuts(
        base,
        flush,
        mode,
        range(CUTS_PER_TEST),
        lambda seed, figures: run_shared_cut(servers, base, flush, mode, seed, figures),
        kept_disk,
        f"tests/test_power_loss_shared.py::test_shared_store_power_cuts[{flush}-{mode}]",
    )
