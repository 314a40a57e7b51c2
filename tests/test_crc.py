"""csrc/lmq_crc.c: zlib's CRC-32 (PCLMULQDQ folding where the CPU has it, slice-by-8 tables otherwise) against
zlib.crc32 for every length up to 4 KiB, at every alignment, chained, large; both implementations on this machine
(the portable one through ``portable=True`` and through LOCALMQ_CRC=portable in a child process)."""

import os
import random
import struct
import subprocess
import sys
import zlib

import pytest

from localmq import _frame, _record
from localmq.layout import BODY_CRC_MASK, FRAME_HEADERS_SIZE, FRAME_MAGIC

IMPLS = [pytest.param(False, id="dispatched"), pytest.param(True, id="portable")]


def _cpu_has_pclmul():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " pclmulqdq" in line for line in f)
    except OSError:
        return False


@pytest.fixture(scope="module")
def buf():
    rng = random.Random(20240601)
    return rng.randbytes(4096 + 64 + 64)


def test_accelerated_where_the_cpu_has_pclmul():
    # on this machine the dispatched path must really be the PCLMULQDQ one, or the tests below test tables twice
    if os.environ.get("LOCALMQ_CRC") == "portable":
        assert not _record._crc32_accelerated()
    else:
        assert _record._crc32_accelerated() == (
            _cpu_has_pclmul() and sys.platform.startswith("linux") and os.uname().machine == "x86_64"
        )


@pytest.mark.parametrize("portable", IMPLS)
def test_every_length_and_alignment(buf, portable):
    rng = random.Random(7)
    for n in range(0, 4097):
        off = rng.randrange(64)
        data = buf[off : off + n]
        assert _record._crc32(memoryview(buf)[off : off + n], 0, portable) == zlib.crc32(data), (n, off)


@pytest.mark.parametrize("portable", IMPLS)
def test_every_alignment_short_and_fold_boundaries(buf, portable):
    mv = memoryview(buf)
    for n in (1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 143, 144, 145, 1024, 4096):
        for off in range(64):
            assert _record._crc32(mv[off : off + n], 0, portable) == zlib.crc32(buf[off : off + n]), (n, off)


@pytest.mark.parametrize("portable", IMPLS)
def test_initial_crc_and_chaining(buf, portable):
    rng = random.Random(11)
    for _ in range(3000):
        n = rng.randrange(4097)
        data = buf[:n]
        cut = rng.randrange(n + 1)
        a = _record._crc32(data[:cut], 0, portable)
        assert _record._crc32(data[cut:], a, portable) == zlib.crc32(data), (n, cut)
        start = rng.getrandbits(32)
        assert _record._crc32(data, start, portable) == zlib.crc32(data, start), (n, start)
    assert _record._crc32(b"", 0x12345678, portable) == 0x12345678
    assert _record._crc32(b"123456789", 0, portable) == 0xCBF43926  # the CRC-32/ISO-HDLC check value


@pytest.mark.parametrize("portable", IMPLS)
def test_large_buffers(portable):
    rng = random.Random(3)
    for n in (1 << 20, (3 << 20) + 13, (5 << 20) - 1):
        data = rng.randbytes(n)
        assert _record._crc32(data, 0, portable) == zlib.crc32(data), n
        assert _record._crc32(bytearray(data)[1:], 0, portable) == zlib.crc32(data[1:]), n
        half = n // 2 + 5
        assert _record._crc32(data[half:], _record._crc32(data[:half], 0, portable), portable) == zlib.crc32(data)
    zeros = bytes(4 << 20)
    assert _record._crc32(zeros, 0, portable) == zlib.crc32(zeros)
    ones = b"\xff" * ((2 << 20) + 3)
    assert _record._crc32(ones, 0, portable) == zlib.crc32(ones)


def test_body_crc_is_the_masked_zlib_crc(buf):
    for n in (0, 1, 31, 32, 100, 1024, 4096):
        assert _record.body_crc(buf[:n]) == zlib.crc32(buf[:n]) & BODY_CRC_MASK
    assert _record.body_crc(bytearray(buf[5:1029])) == zlib.crc32(buf[5:1029]) & BODY_CRC_MASK


def _frame_bytes(body, props, crc):
    hdr = struct.pack(">qqiI", 1, 2, 0, crc)
    assert len(hdr) == FRAME_HEADERS_SIZE
    rest = (
        struct.pack(">i", FRAME_MAGIC)
        + struct.pack(">i", len(body))
        + body
        + struct.pack(">h", len(hdr))
        + hdr
        + struct.pack(">h", len(props))
        + props
    )
    return struct.pack(">i", len(rest) + 4) + rest


@pytest.mark.parametrize("n", [0, 5, 100, 1024, 70000])
def test_frame_crc_is_zlib_of_body_then_properties(buf, n):
    body = (buf * 20)[:n]
    props = b"KEYS\x01k1\x02TAGS\x01t"
    good = _frame_bytes(body, props, zlib.crc32(body + props) & 0x7FFFFFFF)
    assert _frame.walk_frames(good, 0, -1, True)[0] == [0]
    bad = _frame_bytes(body, props, (zlib.crc32(body + props) ^ 1) & 0x7FFFFFFF)
    assert _frame.walk_frames(bad, 0, -1, True)[0] == []


def test_forced_portable_in_a_child_process():
    code = (
        "import random, zlib\n"
        "from localmq import _record\n"
        "assert not _record._crc32_accelerated()\n"
        "r = random.Random(5)\n"
        "for n in list(range(300)) + [1024, 4096, 65536, (1 << 20) + 7]:\n"
        "    d = r.randbytes(n)\n"
        "    assert _record._crc32(d) == zlib.crc32(d), n\n"
        "print('ok')\n"
    )
    env = dict(os.environ, LOCALMQ_CRC="portable")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
