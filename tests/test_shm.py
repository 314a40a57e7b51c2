"""The multi-process primitives of localmq._shm with real processes: the robust writer lock (SIGKILL and SIGSTOP of
its holder), the eventcount's cross-process wake-ups and the fcntl liveness slots."""

import errno
import mmap
import os
import select
import signal
import struct
import time
import traceback

import pytest

from localmq import layout
from localmq._shm import ACQUIRED, OWNER_DIED, ControlFile
from localmq.errors import (
    ControlFileError,
    CorruptStoreError,
    LocalMQError,
    LockNotRecoverableError,
    StoreBusyError,
)

LIMIT = 10.0  # seconds any single exchange with a child may take before the test fails


class Child:
    """A forked process running fn(child_end, *args); line-based messages both ways, every read bounded."""

    def __init__(self, fn, *args):
        r_cmd, w_cmd = os.pipe()
        r_out, w_out = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.close(w_cmd)
                os.close(r_out)
                fn(_End(r_cmd, w_out), *args)
                code = 0
            except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(r_cmd)
        os.close(w_out)
        self.pid = pid
        self.end = _End(r_out, w_cmd)
        self.status = None

    def send(self, *words):
        self.end.send(*words)

    def recv(self, timeout=LIMIT):
        return self.end.recv(timeout)

    def kill(self, sig=signal.SIGKILL):
        if self.status is None:
            os.kill(self.pid, sig)

    def wait(self, timeout=LIMIT):
        """Exit status (os.waitstatus_to_exitcode), failing the test after ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                break
            if time.monotonic() > deadline:
                pytest.fail(f"child {self.pid} did not exit within {timeout} s")
            time.sleep(0.002)
        return self.status

    def reap(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        self.end.close()


class _End:
    def __init__(self, rfd, wfd):
        self.rfd, self.wfd, self.buf = rfd, wfd, b""

    def send(self, *words):
        os.write(self.wfd, (" ".join(str(w) for w in words) + "\n").encode())

    def recv(self, timeout=LIMIT):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                raise TimeoutError(f"no message within {timeout} s")
            data = os.read(self.rfd, 4096)
            if not data:
                raise EOFError("the other end exited")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode().split()

    def close(self):
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def spawn():
    """spawn(fn, *args) -> Child; every child is SIGKILLed (and SIGCONTed) and reaped at teardown."""
    children = []

    def make(fn, *args):
        c = Child(fn, *args)
        children.append(c)
        return c

    yield make
    for c in children:
        c.reap()


@pytest.fixture
def ctl_path(tmp_path):
    return str(tmp_path / layout.CTL_FILE)


@pytest.fixture
def data(tmp_path):
    """A 4 KiB shared scratch file standing in for the state the lock protects; returns its path."""
    path = tmp_path / "data"
    path.write_bytes(bytes(4096))
    return str(path)


def map_data(path):
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, 4096)
    finally:
        os.close(fd)


def now_ns():
    return time.monotonic_ns()  # CLOCK_MONOTONIC: one clock for every process of the machine


# -- the control file ----------------------------------------------------------------------------------------------


def test_first_opener_initialises_later_ones_attach(ctl_path, spawn):
    def attach(end, path):
        with ControlFile(path) as c:
            end.send(int(c.initialised), c.generation)

    with ControlFile(ctl_path) as ctl:
        assert ctl.initialised
        assert os.path.getsize(ctl_path) == layout.CTL_FILE_SIZE
        first = spawn(attach, ctl_path)
        assert first.recv() == ["0", str(ctl.generation)]
        assert first.wait() == 0  # gone (and detached) before the last process leaves below
        gen = ctl.generation
        with pytest.raises(ControlFileError):
            ControlFile(ctl_path)  # a second descriptor's close would drop this process's fcntl locks
    child = spawn(attach, ctl_path)  # everyone left: the next opener starts afresh
    initialised, generation = child.recv()
    assert initialised == "1" and int(generation) != gen


def test_other_version_is_refused_while_attached(ctl_path, spawn):
    def attach(end, path):
        try:
            ControlFile(path)
        except CorruptStoreError as e:
            end.send("corrupt", type(e).__mro__[1].__name__)

    def stay(end, path):
        ControlFile(path)
        end.send("attached")
        end.recv(timeout=3600)

    # this process must not hold the control file: closing the descriptor map_data opens would drop its locks
    assert spawn(stay, ctl_path).recv() == ["attached"]
    m = map_data(ctl_path)
    struct.pack_into("=I", m, layout.CTL_H_VERSION, layout.CTL_VERSION + 1)
    m.close()
    assert spawn(attach, ctl_path).recv() == ["corrupt", "LocalMQError"]


def test_closed_control_file_refuses_use(ctl_path):
    ctl = ControlFile(ctl_path)
    lock = ctl.lock
    ctl.close()
    ctl.close()
    with pytest.raises(ControlFileError):
        lock.acquire()
    with pytest.raises(ControlFileError):
        ctl.events.notify()


def test_close_refused_while_holding_the_lock(ctl_path):
    ctl = ControlFile(ctl_path)
    assert ctl.lock.acquire() == ACQUIRED
    with pytest.raises(ControlFileError):
        ctl.close()
    ctl.lock.release()
    ctl.close()


# -- writer lock ---------------------------------------------------------------------------------------------------


def test_lock_in_one_process(ctl_path):
    with ControlFile(ctl_path) as ctl:
        assert ctl.lock.owner == 0
        assert ctl.lock.acquire(timeout=0) == ACQUIRED
        assert ctl.lock.owner == os.getpid()
        with pytest.raises(OSError) as ei:
            ctl.lock.acquire(timeout=0.01)  # ERRORCHECK: a thread cannot take it twice
        assert ei.value.errno == errno.EDEADLK
        ctl.lock.release()
        assert ctl.lock.owner == 0
        with pytest.raises(OSError):
            ctl.lock.release()
        with ctl.lock as outcome:
            assert outcome == ACQUIRED
        with pytest.raises(ValueError):
            ctl.lock.acquire(timeout=-1)


def test_counter_under_lock_is_exact(ctl_path, data, spawn):
    n_procs, n_incr = 4, 400

    def worker(end, path, data_path):
        d = map_data(data_path)
        with ControlFile(path) as c:
            end.send("ready")
            end.recv()
            for _ in range(n_incr):
                c.lock.acquire(timeout=LIMIT)
                v = struct.unpack_from("=q", d, 0)[0]  # a read-modify-write that races without the lock
                for _ in range(20):
                    pass
                struct.pack_into("=q", d, 0, v + 1)
                c.lock.release()
            end.send("done")

    with ControlFile(ctl_path):
        kids = [spawn(worker, ctl_path, data) for _ in range(n_procs)]
        for k in kids:
            assert k.recv() == ["ready"]
        for k in kids:
            k.send("go")
        for k in kids:
            assert k.recv(timeout=60) == ["done"]
            assert k.wait() == 0
    m = map_data(data)
    assert struct.unpack_from("=q", m, 0)[0] == n_procs * n_incr
    m.close()


def _hold_then_hang(end, path, data_path):
    """Take the lock, mark the protected state dirty (an update in progress), report, and wait to be killed."""
    d = map_data(data_path)
    c = ControlFile(path)
    assert c.lock.acquire(timeout=LIMIT) == ACQUIRED
    struct.pack_into("=q", d, 8, 1)  # dirty
    end.send("held")
    end.recv(timeout=3600)  # until killed, or told to release
    struct.pack_into("=q", d, 8, 0)
    c.lock.release()
    end.send("released")
    end.recv(timeout=3600)


def _acquire_and_repair(end, path, data_path):
    """Wait in acquire; on owner_died repair the dirty state, mark consistent, release; report outcome and time."""
    d = map_data(data_path)
    with ControlFile(path) as c:
        end.send("waiting")
        outcome = c.lock.acquire(timeout=LIMIT)
        t = now_ns()
        dead = c.lock.owner
        if outcome == OWNER_DIED:
            assert struct.unpack_from("=q", d, 8)[0] == 1
            struct.pack_into("=q", d, 8, 0)
            struct.pack_into("=q", d, 16, struct.unpack_from("=q", d, 16)[0] + 1)  # repairs counted
            c.lock.consistent()
        c.lock.release()
        end.send(outcome, t, dead)


def test_sigkill_of_the_holder_hands_the_lock_over(ctl_path, data, spawn):
    rounds = 16
    worst = 0
    with ControlFile(ctl_path) as ctl:
        m = map_data(data)
        for i in range(rounds):
            holder = spawn(_hold_then_hang, ctl_path, data)
            assert holder.recv() == ["held"]
            if i % 2:
                # a waiter in another process already blocked in acquire() is woken by the kernel
                waiter = spawn(_acquire_and_repair, ctl_path, data)
                assert waiter.recv() == ["waiting"]
                time.sleep(0.01)  # let it block in the futex (either way it must get owner_died)
                t0 = now_ns()
                holder.kill()
                outcome, t, dead = waiter.recv()
                assert (outcome, int(dead)) == (OWNER_DIED, holder.pid)
                took = int(t) - t0
                assert waiter.wait() == 0
            else:
                t0 = now_ns()
                holder.kill()
                assert ctl.lock.acquire(timeout=LIMIT) == OWNER_DIED
                took = now_ns() - t0
                assert ctl.lock.owner == holder.pid  # the dead holder, for the warning
                assert struct.unpack_from("=q", m, 8)[0] == 1
                struct.pack_into("=q", m, 8, 0)
                struct.pack_into("=q", m, 16, struct.unpack_from("=q", m, 16)[0] + 1)
                ctl.lock.consistent()
                ctl.lock.release()
            worst = max(worst, took)
            assert took < 1e9, f"round {i}: the lock came back {took / 1e6:.1f} ms after the kill"
            holder.wait()
            # the lock is sound again: a plain acquisition, state clean
            assert ctl.lock.acquire(timeout=1) == ACQUIRED
            assert struct.unpack_from("=q", m, 8)[0] == 0
            ctl.lock.release()
        assert struct.unpack_from("=q", m, 16)[0] == rounds
        assert ctl.lock.recoveries == rounds
        m.close()
    print(f"worst kill -> owner_died: {worst / 1e3:.0f} us")


def test_release_without_consistent_is_not_recoverable_until_reinitialised(ctl_path, data, spawn):
    ctl = ControlFile(ctl_path)
    holder = spawn(_hold_then_hang, ctl_path, data)
    assert holder.recv() == ["held"]
    holder.kill()
    holder.wait()
    assert ctl.lock.acquire(timeout=LIMIT) == OWNER_DIED
    ctl.lock.release()  # no repair, no consistent(): POSIX makes the mutex unusable
    with pytest.raises(LockNotRecoverableError):
        ctl.lock.acquire(timeout=1)
    ctl.close()
    with ControlFile(ctl_path) as again:  # nobody attached: the first opener re-initialises
        assert again.initialised
        assert again.lock.acquire(timeout=0) == ACQUIRED
        again.lock.release()


def test_sigstop_of_the_holder_times_out_and_never_takes_over(ctl_path, data, spawn):
    def try_once(end, path):
        with ControlFile(path) as c:
            t0 = time.monotonic()
            try:
                c.lock.acquire(timeout=0.2)
                end.send("acquired")
            except StoreBusyError as e:
                end.send("busy", e.pid, f"{time.monotonic() - t0:.3f}")

    with ControlFile(ctl_path) as ctl:
        holder = spawn(_hold_then_hang, ctl_path, data)
        assert holder.recv() == ["held"]
        holder.kill(signal.SIGSTOP)
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(StoreBusyError) as ei:
                ctl.lock.acquire(timeout=0.3)
            waited = time.monotonic() - t0
            assert ei.value.pid == holder.pid and str(holder.pid) in str(ei.value)
            assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, LocalMQError)
            assert 0.29 <= waited < 3
        with pytest.raises(StoreBusyError):
            ctl.lock.acquire(timeout=0)
        kind, pid, waited = spawn(try_once, ctl_path).recv()
        assert (kind, int(pid)) == ("busy", holder.pid) and float(waited) >= 0.19
        holder.kill(signal.SIGCONT)
        holder.send("release")
        assert holder.recv() == ["released"]
        assert ctl.lock.acquire(timeout=LIMIT) == ACQUIRED  # a clean hand-over, never owner_died
        assert ctl.lock.recoveries == 0
        ctl.lock.release()


def _hold_on_a_thread(end, path):
    """Take the lock on a thread that is not the main one (its thread id is not the pid), report, wait."""
    import threading

    c = ControlFile(path)
    held = threading.Event()

    def take():
        assert c.lock.acquire(timeout=LIMIT) == ACQUIRED
        held.set()
        time.sleep(3600)

    threading.Thread(target=take, daemon=True).start()
    assert held.wait(LIMIT)
    end.send("held")
    end.recv(timeout=3600)


def test_a_holder_caught_before_it_recorded_its_pid_is_named_by_the_mutex_owner(ctl_path, spawn):
    # a holder stopped in the few instructions between taking the mutex and recording its pid (or between clearing it
    # and releasing) left the pid word 0: the waiter's StoreBusyError named "pid 0" (seen once in
    # tests/test_shared.py). The mutex's futex word names the holder's thread; its process is the one named
    with ControlFile(ctl_path) as ctl:
        holder = spawn(_hold_on_a_thread, ctl_path)
        assert holder.recv() == ["held"]
        assert ctl.lock.owner == holder.pid
        # the recorded pid, after the mutex in the lock's section (csrc/lmq_shm.c lmq_shm_lock); the mutex itself holds
        # the thread id, not the pid (the holder is not the main thread)
        section = struct.unpack(
            f"={layout.CTL_LOCK_SIZE // 4}i", ctl.read_bytes(layout.CTL_LOCK_OFF, layout.CTL_LOCK_SIZE)
        )
        assert section.count(holder.pid) == 1
        pid_word = layout.CTL_LOCK_OFF + 4 * section.index(holder.pid)
        ctl.write_bytes(pid_word, struct.pack("=i", 0))  # as if caught in that window
        with pytest.raises(StoreBusyError) as ei:
            ctl.lock.acquire(timeout=0.2)
        assert ei.value.pid == holder.pid and str(holder.pid) in str(ei.value)
        assert ctl.lock.owner == holder.pid


# -- eventcount ----------------------------------------------------------------------------------------------------


def test_eventcount_in_one_process(ctl_path):
    with ControlFile(ctl_path) as ctl:
        ev = ctl.events
        s = ev.seq()
        assert not ev.has_waiters
        assert ev.notify() is False  # nobody waits: no FUTEX_WAKE
        assert ev.seq() != s
        assert ev.wait(s, timeout=5) is True  # moved before the call: returns at once
        s = ev.seq()
        t0 = time.monotonic()
        assert ev.wait(s, timeout=0.1) is False
        assert 0.09 <= time.monotonic() - t0 < 2
        assert ev.wait(s, timeout=0) is False
        # the waiter bit stays set after a timed-out wait; the next notify clears it (one spurious FUTEX_WAKE)
        assert ev.has_waiters
        assert ev.notify() is True
        assert not ev.has_waiters
        assert ev.notify() is False


def test_eventcount_wakes_a_waiter_in_another_process(ctl_path, spawn):
    def waiter(end, path, rounds):
        with ControlFile(path) as c:
            for _ in range(rounds):
                s = c.events.seq()
                end.send("ready")
                ok = c.events.wait(s, timeout=LIMIT)
                end.send(int(ok), now_ns())

    rounds = 20
    lat = []
    with ControlFile(ctl_path) as ctl:
        child = spawn(waiter, ctl_path, rounds)
        for _ in range(rounds):
            assert child.recv() == ["ready"]
            deadline = time.monotonic() + LIMIT
            while not ctl.events.has_waiters:  # it announced itself: it is (about to be) asleep in FUTEX_WAIT
                assert time.monotonic() < deadline
                time.sleep(0.0005)
            t0 = now_ns()
            assert ctl.events.notify() is True
            ok, t = child.recv()
            assert ok == "1"
            lat.append(int(t) - t0)
        assert child.wait() == 0
        assert not ctl.events.has_waiters
        assert ctl.events.notify() is False
    lat.sort()
    assert lat[-1] < 1e9
    print(f"cross-process wake-up p50 {lat[len(lat) // 2] / 1e3:.0f} us, max {lat[-1] / 1e3:.0f} us")


def test_eventcount_notify_before_wait_is_not_lost(ctl_path, spawn):
    def late_waiter(end, path):
        with ControlFile(path) as c:
            s = c.events.seq()
            end.send("seq")
            end.recv()  # the notify happens here, before wait()
            end.send(int(c.events.wait(s, timeout=LIMIT)))

    with ControlFile(ctl_path) as ctl:
        child = spawn(late_waiter, ctl_path)
        assert child.recv() == ["seq"]
        assert ctl.events.notify() is False
        child.send("go")
        assert child.recv(timeout=2) == ["1"]


# -- slots ---------------------------------------------------------------------------------------------------------


def _claim_and_hang(end, path):
    c = ControlFile(path)
    end.send(c.slots.claim())
    end.recv(timeout=3600)


def test_slot_of_a_killed_process_is_free_at_once(ctl_path, spawn):
    with ControlFile(ctl_path) as ctl:
        a = spawn(_claim_and_hang, ctl_path)
        b = spawn(_claim_and_hang, ctl_path)
        sa, sb = int(a.recv()[0]), int(b.recv()[0])
        assert sa != sb
        assert ctl.slots.alive(sa) and ctl.slots.alive(sb)
        assert ctl.slots.holder(sa) == a.pid and ctl.slots.claimed_pid(sa) == a.pid
        a.kill()
        a.wait()
        assert not ctl.slots.alive(sa)  # the kernel dropped the lock with the process: no pid check involved
        assert ctl.slots.holder(sa) == 0
        assert ctl.slots.claimed_pid(sa) == a.pid  # the record stays; it says nothing about liveness
        assert ctl.slots.alive(sb)
        b.kill(signal.SIGSTOP)
        assert ctl.slots.alive(sb)  # stopped is alive
        mine = ctl.slots.claim()
        assert mine not in (sb,) and ctl.slots.alive(mine) and ctl.slots.mine() == mine
        assert ctl.slots.claim() == mine
        ctl.slots.release()
        assert ctl.slots.mine() is None
        with pytest.raises(ValueError):
            ctl.slots.alive(layout.CTL_SLOT_COUNT)


def test_forked_child_does_not_hold_its_parents_slot(ctl_path, spawn):
    def parent(end, path):
        c = ControlFile(path)
        mine = c.slots.claim()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the grandchild inherits the descriptor and the object, not the fcntl lock
            try:
                os.close(r)
                try:  # the inherited object refuses use: closing its descriptor would drop the child's own locks
                    c.slots.claim()
                    os.write(w, b"inherited object usable\n")
                    os._exit(0)
                except ControlFileError:
                    pass
                c2 = ControlFile(path)  # the child's own attachment
                other = c2.slots.claim()
                os.write(w, f"{c2.slots.alive(mine)} {c2.slots.holder(mine)} {other} {c2.slots.mine()}\n".encode())
                os.read(os.open(os.devnull, os.O_RDONLY), 1)
            finally:
                os._exit(0)
        os.close(w)
        line = os.read(r, 200).decode().split()
        alive_mine, holder_mine, other, child_mine = line
        os.waitpid(pid, 0)
        end.send(mine, alive_mine, holder_mine, other, child_mine, pid, int(c.slots.alive(int(other))))
        end.recv(timeout=3600)

    with ControlFile(ctl_path) as ctl:
        p = spawn(parent, ctl_path)
        mine, alive_mine, holder_mine, other, child_mine, _gpid, other_alive_after = p.recv()
        assert alive_mine == "True" and int(holder_mine) == p.pid  # the child sees its parent's slot as held
        assert other != mine and child_mine == other  # and had to claim another one
        assert other_alive_after == "0"  # gone with the grandchild
        assert ctl.slots.alive(int(mine)) and not ctl.slots.alive(int(other))
        p.kill()
        p.wait()
        assert not ctl.slots.alive(int(mine))
