# cython: boundscheck=False, wraparound=False, cdivision=True
"""Offset message ids (store host, port and physical offset in hex) and the stored host bytes ("ip:port")."""
import ipaddress

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

from localmq._layout cimport HOST_V4_SIZE, HOST_V6_SIZE
from localmq._os cimport lmq_be32, lmq_put64


def pack_host(text):
    """``"ip:port"`` / ``"[ipv6]:port"`` -> the stored bytes (address, then int32 big-endian port)."""
    if text.startswith("["):
        host, _, port = text[1:].partition("]:")
    else:
        host, _, port = text.rpartition(":")
    return ipaddress.ip_address(host).packed + int(port).to_bytes(4, "big", signed=True)


cdef str host_text(const uint8_t *p, int n):
    cdef int32_t port = <int32_t>lmq_be32(p + n - 4)
    addr = ipaddress.ip_address(PyBytes_FromStringAndSize(<const char *>p, n - 4))
    if n == HOST_V6_SIZE:
        return f"[{addr}]:{port}"
    return f"{addr}:{port}"


cdef str msg_id_of(const uint8_t *host, int host_len, int64_t offset):
    """Offset message id: store host address, port and physical offset as uppercase hex (32 or 56 chars)."""
    cdef uint8_t raw[28]
    cdef char out[56]
    cdef int i, n = host_len + 8
    memcpy(raw, host, host_len)
    lmq_put64(raw + host_len, <uint64_t>offset)
    for i in range(n):
        out[2 * i] = b"0123456789ABCDEF"[raw[i] >> 4]
        out[2 * i + 1] = b"0123456789ABCDEF"[raw[i] & 15]
    return (<bytes>PyBytes_FromStringAndSize(out, 2 * n)).decode("ascii")


def create_message_id(store_host, long long offset):
    """Offset message id for ``store_host`` ("ip:port" or packed bytes) and a physical offset."""
    cdef bytes h = store_host if isinstance(store_host, bytes) else pack_host(store_host)
    if len(h) not in (HOST_V4_SIZE, HOST_V6_SIZE):
        raise ValueError("store host must pack to 8 or 20 bytes")
    return msg_id_of(<const uint8_t *>PyBytes_AS_STRING(h), len(h), offset)


def decode_message_id(str msg_id):
    """Split an offset message id into ("ip:port", physical offset). Raises ValueError on a malformed id."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"not an offset message id: {msg_id!r}")
    raw = bytes.fromhex(msg_id)
    n = len(raw) - 8
    host = host_text(<const uint8_t *>PyBytes_AS_STRING(raw), n)
    return host, int.from_bytes(raw[n:], "big", signed=True)
