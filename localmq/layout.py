"""Every on-disk constant of the store, written down once (RocketMQ 4.x layouts, as Apache RocketMQ's
store writes them: CommitLog, ConsumeQueue, IndexFile, StoreCheckpoint in rocketmq-store).

Pure Python, importing nothing of localmq. The compiled modules read the same values from ``_layout.pxd``, which
setup.py generates from this file (``pxd_source``); tests/test_layers.py checks that the two agree. No other module
repeats a number below: it imports the name.
"""

from __future__ import annotations

import re
import struct

import numpy as np

# -- CommitLog record (V1): fixed header fields and their byte offsets ---------------------------------------------

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7: a V1 message record
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB: RocketMQ 5.x V2 record (int16 topic length), for topics > 127
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194: the blank record that ends a segment
END_FILE_MIN_BLANK_LENGTH = 8  # TOTALSIZE + MAGIC of the blank record
# A gap record (localmq's, written by recovery over damaged bytes it quarantined): a blank record whose TOTALSIZE is
# the length of the damaged region, not the rest of the segment, followed by this 8-byte signature ("LMQ.GAP!").
# localmq's walkers skip TOTALSIZE bytes and go on; RocketMQ reads a blank and goes on in the next segment.
GAP_SIGNATURE = 0x4C4D512E47415021
GAP_RECORD_SIZE = 16  # TOTALSIZE + MAGIC + signature: the smallest gap recovery can mark

REC_TOTAL_SIZE = 0  # int32
REC_MAGIC = 4  # int32
REC_BODY_CRC = 8  # int32: zlib CRC-32 of the body & BODY_CRC_MASK
REC_QUEUE_ID = 12  # int32
REC_FLAG = 16  # int32
REC_QUEUE_OFFSET = 20  # int64
REC_PHYSICAL_OFFSET = 28  # int64
REC_SYS_FLAG = 36  # int32
REC_BORN_TIMESTAMP = 40  # int64
REC_BORN_HOST = 48  # 4-byte IPv4 or 16-byte IPv6 address, then an int32 port
# after the born host: STORETIMESTAMP i64, STOREHOST (8 or 20), RECONSUMETIMES i32, PREPARED TX OFFSET i64,
# BODY i32 + bytes, TOPIC i8 + bytes (V2: i16 + bytes), PROPERTIES i16 + bytes
HOST_V4_SIZE = 8
HOST_V6_SIZE = 20
REC_MIN_SIZE = 91  # a V1 record with IPv4 hosts and empty body, topic and properties
BODY_CRC_MASK = 0x7FFFFFFF

MAX_TOPIC_BYTES = 127  # int8 TOPIC length: the longest topic of a V1 record
MAX_TOPIC_BYTES_V2 = 32767  # int16 TOPIC length of a V2 record (RocketMQ 5.x)
# The longest topic localmq reads or writes: a ConsumeQueue directory is named after its topic, and a file name has
# at most 255 bytes (NAME_MAX). Topics of 128..255 bytes are written as V2 records, as RocketMQ 5.x does.
MAX_TOPIC_NAME_BYTES = 255
MAX_PROPERTIES_SIZE = 32767  # int16 PROPERTIES length
PROPERTY_NAME_SEP = 0x01  # name \x01 value \x02 name \x01 value \x02
PROPERTY_SEP = 0x02

# sysflag bits (MessageSysFlag)
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_NOT_TYPE = 0x0
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

# -- ConsumeQueue: 20-byte big-endian units ----------------------------------------------------------------------

CQ_UNIT_SIZE = 20  # commit log offset i64, size i32, tags code i64
CQ_BLANK_UNIT_SIZE = 0x7FFFFFFF  # a padding unit (offset 0, size MAX, tags 0) a queue may start with
# tags codes at or below this are ConsumeQueueExt addresses (ext offset + Long.MIN_VALUE); no int32 hash reaches it
CQ_EXT_ADDRESS_MAX = -2147483649
# The unit as numpy sees it. ``tags_code`` is RocketMQ's name; the title ``tags`` keeps the ConsumeQueue.units()
# field name of earlier releases working (arr["tags"] and arr["tags_code"] are the same column).
CQ_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), (("tags", "tags_code"), ">i8")])
CQ_EXT_HEAD = struct.Struct(">hqqh")  # ConsumeQueueExt unit: size, tagsCode, msgStoreTime, bitMapSize
CQ_EXT_SIZE = struct.Struct(">h")  # its leading size field alone (0: the end of the written units)
CQ_EXT_END_BLANK_DATA_LENGTH = 4

# -- IndexFile: header, hash slots, linked items -----------------------------------------------------------------

INDEX_HEADER_SIZE = 40
INDEX_HEADER = struct.Struct(">qqqqii")  # begin ts, end ts, begin phy, end phy, hash slot count, index count
INDEX_H_BEGIN_TS = 0
INDEX_H_END_TS = 8
INDEX_H_BEGIN_PHY = 16
INDEX_H_END_PHY = 24
INDEX_H_SLOT_COUNT = 32
INDEX_H_INDEX_COUNT = 36
INDEX_SLOT_SIZE = 4  # int32: number of the newest item of the slot
INDEX_ITEM_SIZE = 20  # key hash i32, physical offset i64, time diff i32 (s), prev item i32
INDEX_ITEMS_PER_SLOT = 4  # RocketMQ's ratio (defaults 20M / 5M; IndexFileTest 400 / 100)
INDEX_NAME_DIGITS = 17  # yyyyMMddHHmmssSSS
INDEX_MAX_FILE_SIZE = (1 << 31) - 1  # RocketMQ computes positions in an int
INDEX_MAX_KEY_BYTES = MAX_TOPIC_NAME_BYTES + 1 + 1 + MAX_PROPERTIES_SIZE + 1  # "<topic>#<key>"

# -- checkpoint ----------------------------------------------------------------------------------------------------

CHECKPOINT_FILE_SIZE = 4096  # RocketMQ maps one OS page
CHECKPOINT = struct.Struct(">5q")  # physic, logics, index, master flushed offset, confirm phy offset
CHECKPOINT_MIN_SIZE = CHECKPOINT.size  # 40

# -- files and names -----------------------------------------------------------------------------------------------

OS_PAGE_SIZE = 4096
FILE_NAME_DIGITS = 20  # segments and ConsumeQueue files: 20-digit zero-padded base offset
SEGMENT_NAME_RE = re.compile(r"\d{20}")
COMMITLOG_DIR = "commitlog"
RECOVERY_DIR = "recovery"  # what recovery cut or replaced, kept: commitlog-tail-*, commitlog-gap-*
GAP_FILE_RE = re.compile(r"commitlog-gap-(\d{20})-\d+\.bin")  # one per gap record: its offset, then a time stamp
CONSUMEQUEUE_DIR = "consumequeue"
CONSUMEQUEUE_EXT_DIR = "consumequeue_ext"
INDEX_DIR = "index"
CONFIG_DIR = "config"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
SETTINGS_FILE = "localmq.json"  # in CONFIG_DIR: the settings that shape the files, written at creation
SETTINGS_VERSION = 1  # its "version"; a record of a later version is refused

# -- the queue snapshot (localmq's own): the ConsumeQueues' ends, written at a clean close ----------------------------
# config/queues.snapshot vouches for every ConsumeQueue file it names whose inode, size and change time are still
# the ones it recorded, so that the next open need not read them (store/queue_snapshot.py)
QUEUE_SNAPSHOT_FILE = "queues.snapshot"  # in CONFIG_DIR
QUEUE_SNAPSHOT_MAGIC = 0x4C4D5153  # "LMQS"
# config/queues.running: the same rows at a cut of a running store (every record before its log end dispatched,
# flushed in the log and in the queues), written by the queue flush's thorough pass; read only after a crash
QUEUE_SNAPSHOT_RUNNING_FILE = "queues.running"  # in CONFIG_DIR
QUEUE_SNAPSHOT_RUNNING_MAGIC = 0x4C4D5152  # "LMQR"
# config/queues.handover: a store shared between processes: the rows its first opener took (or made) at the open, for
# the last process to close it, which writes queues.snapshot from them and what the processes changed since; never
# read by an open (every open deletes it), not made durable
QUEUE_SNAPSHOT_HANDOVER_FILE = "queues.handover"  # in CONFIG_DIR
QUEUE_SNAPSHOT_HANDOVER_MAGIC = 0x4C4D5148  # "LMQH"
QUEUE_SNAPSHOT_VERSION = 1
QUEUE_SNAPSHOT_HEADER = struct.Struct(">IIIq")  # magic, version, CRC-32 of the body, body length
# body: cq file size, commit log file size, the log's min offset the rows' min offsets are right for (-1: not
# known), the log's end, the consumequeue directory's (ctime ns, inode), segment count, topic count; then the
# checkpoint's first bytes (CHECKPOINT.size), the segments, the topics each followed by its queues and their files
QUEUE_SNAPSHOT_META = struct.Struct(">qqqqqqII")
QUEUE_SNAPSHOT_FILE_ROW = struct.Struct(">qqq")  # a segment or a queue file: base offset, ctime ns, inode
QUEUE_SNAPSHOT_TOPIC_ROW = struct.Struct(">HqqI")  # name length (the name follows), dir ctime ns, inode, queue count
# a queue: id, dir ctime ns (-1: not vouched for), inode, max offset, min offset, max physical offset, file count
QUEUE_SNAPSHOT_QUEUE_ROW = struct.Struct(">IqqqqqI")
QUEUE_SNAPSHOT_NOT_VOUCHED = -1  # a ctime field: the entry is listed, not vouched for
# the row sizes the compiled parse of the rows reads (localmq/_snapshot.pyx; its field offsets follow the formats)
QUEUE_SNAPSHOT_TOPIC_ROW_SIZE = QUEUE_SNAPSHOT_TOPIC_ROW.size
QUEUE_SNAPSHOT_QUEUE_ROW_SIZE = QUEUE_SNAPSHOT_QUEUE_ROW.size
QUEUE_SNAPSHOT_FILE_ROW_SIZE = QUEUE_SNAPSHOT_FILE_ROW.size

MAX_QUEUE_ID = 65535
TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]{1,255}\Z")  # MAX_TOPIC_NAME_BYTES

# -- the embedded queue's simple frame (localmq's own, not RocketMQ's) --------------------------------------------

FRAME_MAGIC = 0x4C4D5146  # "LMQF"
FRAME_HEADERS_SIZE = 24  # store ts i64, born ts i64, flag i32, crc u32
FRAME_OVERHEAD = 4 + 4 + 4 + 2 + FRAME_HEADERS_SIZE + 2  # TOTALSIZE, MAGIC, BODY len, HEADERS len, PROPERTIES len
FRAME_BODY_LEN = struct.Struct(">i")  # the body length field, at FRAME_BODY_LEN_AT
FRAME_BODY_LEN_AT = 8
FRAME_BODY_AT = 12
FRAME_STORE_TS = struct.Struct(">q")  # the first header field, after the body and the int16 HEADERS length


def frame_store_ts_at(body_len: int) -> int:
    """Position of the store timestamp in an embedded-queue frame whose body is ``body_len`` bytes."""
    return FRAME_BODY_AT + body_len + 2


# -- the multi-process control file <root>/mpctl (localmq's own; native-endian: it holds a pthread mutex) ---------
# A fixed-size file mapped MAP_SHARED by every process attached to a store. A cache of shared state, not a durable
# record: the first process to attach (an exclusive fcntl lock on CTL_LOCK_BYTE_OPEN) initialises it afresh.
# Sections start on their own cache lines (128 B apart, so adjacent-line prefetch does not couple them).

CTL_FILE = "mpctl"
CTL_MAGIC = 0x4C4D5143  # "LMQC", written last by the initialiser
CTL_VERSION = 4  # 4: the topic table is a hash index into an arena of rows (issue 27)
CTL_H_MAGIC = 0  # u32
CTL_H_VERSION = 4  # u32
CTL_H_FILE_SIZE = 8  # u32
CTL_H_SLOT_COUNT = 12  # u32
CTL_H_GENERATION = 16  # u64: random, new at every initialisation
CTL_H_INIT_PID = 24  # i32: the initialiser (messages only)
CTL_H_INIT_TIME_MS = 32  # i64: CLOCK_REALTIME of the initialisation
CTL_LOCK_OFF = 128  # the writer lock: robust process-shared mutex + owner pid (csrc/lmq_shm.h)
CTL_LOCK_SIZE = 64  # LMQ_SHM_LOCK_BYTES
CTL_EVENT_OFF = 256  # eventcount "committed": every put notifies it (the dispatcher waits)
CTL_EVENT_SIZE = 64  # LMQ_SHM_EVENT_BYTES
CTL_DISPATCH_EVENT_OFF = 384  # eventcount "dispatched": the dispatcher notifies it (consumers wait)
CTL_GROUP_LOCK_OFF = 768  # the group lock (robust mutex): guards the clients' table
CTL_FLUSHED_EVENT_OFF = 896  # eventcount "flushed": SYNC_FLUSH puts of every process wait on it
CTL_FLUSH_REQ_EVENT_OFF = 960  # eventcount "flush requested": the housekeeper's group commit waits on it
# The store section (i64 each unless noted). Written under the writer lock unless noted; read by anyone.
CTL_S_READY = 512  # i64: 1 once a first opener recovered the store and filled this section
CTL_S_WPOS = 520  # committed end of the CommitLog (release store: THE commit point)
CTL_S_LAST_TS = 528  # store timestamp of the last put (store times never go backwards)
CTL_S_SEG_SIZE = 536  # CommitLog segment size (every attacher must use it)
CTL_S_CQ_SIZE = 544  # ConsumeQueue file size
CTL_S_REPUT = 552  # dispatched end of the CommitLog (the housekeeper, release store)
CTL_S_HOUSEKEEPER = 560  # pid of the housekeeper (messages only; liveness is its fcntl byte)
CTL_S_REPAIRS = 568  # torn puts repaired after their writer died
CTL_S_PUTS = 576  # committed put calls (put or put_batch), every process
CTL_S_CQ_MIN = 584  # min offset of the CommitLog the ConsumeQueues follow (housekeeper)
CTL_S_DISK_FULL = 600  # 1 while the housekeeper finds the disk full (every process refuses puts)
CTL_S_FLUSHED = 608  # CommitLog end known to be on disk (SYNC_FLUSH group commit, housekeeper)
CTL_S_FLUSH_REQ = 616  # highest end a SYNC_FLUSH put waits for (any process, CAS max)
CTL_S_SYNC_ARRIVALS = 624  # SYNC_FLUSH puts that began waiting, ever (any process, atomic add)
CTL_S_SYNC_WANT = 632  # the arrivals count at which the group commit wants a wake-up (housekeeper)
CTL_S_INDEXED = 592  # CommitLog offset below which every record is in the IndexFile (housekeeper)
# The intent record: what the writer-lock holder is doing, so a taker-over can repair a torn put.
CTL_I_STATE = 640  # 1 while a put is between its first byte and its commit
CTL_I_POS = 648  # wpos when the put began
CTL_I_END = 656  # highest end of bytes written so far (written before the bytes)
CTL_I_CELL = 664  # byte offset, in this file, of the queue's next-offset cell
CTL_I_QOFF = 672  # that cell's value before the put
CTL_I_QEND = 680  # its value after the put (written just before the commit)
CTL_S_TOPIC_ROWS = 688  # i64: rows of the topic arena in use (written under the writer lock)
CTL_S_ROWS_UNCHECKED = 696  # i64: pid of a first opener whose check of its snapshot's rows failed (it keeps the store)
CTL_SLOTS_OFF = 4096  # slot records: CTL_SLOT_COUNT x CTL_SLOT_SIZE
CTL_SLOT_SIZE = 64
CTL_SLOT_COUNT = 256
CTL_SLOT_PID = 0  # i32: the claimer's pid (messages only; liveness is the fcntl lock)
CTL_SLOT_CLAIMED_MS = 8  # i64: CLOCK_REALTIME of the claim
# The topic table: an index of CTL_TOPIC_SLOTS u32 slots (open addressing by FNV-1a of the name; a slot holds a row
# number + 1, 0 = empty, release-stored last) into an arena of rows at CTL_ROWS_OFF, appended (never removed) under
# the writer lock. The arena is sparse: a row's blocks are reserved (fallocate) when it is added, so a shared
# store's topic capacity costs disk only as it is used (about 1.3 KB per topic).
CTL_TOPICS_OFF = 20480
CTL_TOPIC_SLOTS = 1 << 18  # u32 index slots (the index is at most half full)
CTL_TOPIC_COUNT = 1 << 17  # topics one shared store can hold (131,072)
CTL_TOPIC_QUEUES = 64  # queue ids 0..63 per topic in a shared store
CTL_TOPIC_ROW = 1280
CTL_T_STATE = 0  # u32: 1 once the row is complete (release store, the last write)
CTL_T_NAME_LEN = 4  # u32
CTL_T_NAME = 8  # the topic, ASCII, at most CTL_T_NAME_MAX bytes
CTL_T_NEXT = 256  # i64 x CTL_TOPIC_QUEUES: next queue offset (the put path's cells)
CTL_T_NAME_MAX = CTL_T_NEXT - CTL_T_NAME  # 248: a shared store refuses a longer topic (InvalidTopicError)
CTL_T_DISPATCHED = 768  # i64 x CTL_TOPIC_QUEUES: units in the ConsumeQueue (the dispatcher)
# The clients' table: consumer groups (members, queue owners) and committed offsets of every process, one JSON
# document written under the group lock into the inactive one of two buffers, then published by switching
# CTL_C_ACTIVE (a writer that dies mid-write leaves the previous document in force).
CTL_CLIENTS_OFF = CTL_TOPICS_OFF + 4 * CTL_TOPIC_SLOTS
CTL_C_VERSION = CTL_CLIENTS_OFF  # i64: bumped by every change (readers re-parse when it moved)
CTL_C_ACTIVE = CTL_CLIENTS_OFF + 8  # i64: 0 or 1, the buffer in force
CTL_C_LEN = CTL_CLIENTS_OFF + 16  # i64 x 2: bytes of each buffer's document
CTL_C_BUF = CTL_CLIENTS_OFF + 64  # two buffers of CTL_C_BUF_SIZE
CTL_C_BUF_SIZE = 512 * 1024
CTL_ROWS_OFF = (CTL_C_BUF + 2 * CTL_C_BUF_SIZE + 4095) // 4096 * 4096  # the topic arena (sparse, see above)
CTL_FILE_SIZE = CTL_ROWS_OFF + CTL_TOPIC_COUNT * CTL_TOPIC_ROW
# fcntl record-lock bytes (advisory, they may lie beyond the end of the file)
CTL_LOCK_BYTE_OPEN = 0  # write lock: initialising; read lock: attached
CTL_LOCK_BYTE_STORE = 1  # write lock: opening (recovery or attach) or closing the store, one at a time
CTL_LOCK_BYTE_HOUSEKEEPER = 2  # write lock: the housekeeper (dispatch, flush, index, retention)
CTL_LOCK_BYTE_OFFSETS = 3  # write lock: writing config/consumerOffset.json
CTL_SLOT_LOCK_BASE = CTL_FILE_SIZE  # slot k is held while byte CTL_SLOT_LOCK_BASE + k is write-locked


def is_decimal(text: str) -> bool:
    """True for ASCII digits only: the names of the store's files and queue directories, numeric properties.
    ``str.isdigit`` alone also takes "²" (which ``int`` refuses: a ValueError out of an open) and "٣" (which ``int``
    reads as 3: a directory taken for another's)."""
    return text.isascii() and text.isdigit()


def interrupted_creation(index: int, count: int, size: int) -> bool:
    """True for the file at ``index`` of ``count`` numbered files (segments, partitions, ConsumeQueue files, in name
    order) when it is the last one and empty: a creation a kill cut short, or one under way (RocketMQ's allocator
    creates a file, then sizes it; 5.x's load deletes such a file, 4.9's refuses it). It holds nothing: a writer
    sizes it again, a reader leaves it out, neither reports it as damage."""
    return size == 0 and index == count - 1


def file_name(offset: int) -> str:
    """The 20-digit zero-padded decimal name of a segment or ConsumeQueue file starting at ``offset``."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def host_size(sys_flag: int, bit: int) -> int:
    """Bytes of a born or store host field (address + port) given the record's sysflag and the host's V6 bit."""
    return HOST_V6_SIZE if sys_flag & bit else HOST_V4_SIZE


def topic_length_size(topic_len: int) -> int:
    """Bytes of the TOPIC length field of the record RocketMQ 5.x writes for a topic of ``topic_len`` bytes (its
    autoMessageVersionOnTopicLen): 1 (V1) up to MAX_TOPIC_BYTES, else 2 (V2)."""
    return 1 if topic_len <= MAX_TOPIC_BYTES else 2


def record_size(sys_flag: int, body_len: int, topic_len: int, props_len: int) -> int:
    """TOTALSIZE of the record of a topic of ``topic_len`` bytes (RocketMQ's CommitLog.calMsgLength, with 5.x's
    topicLengthSize: V1 up to 127 bytes, V2 above)."""
    return (
        4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + host_size(sys_flag, SYSFLAG_BORNHOST_V6)
        + 8
        + host_size(sys_flag, SYSFLAG_STOREHOST_V6)
        + 4
        + 8
        + 4
        + body_len
        + topic_length_size(topic_len)
        + topic_len
        + 2
        + props_len
    )


# -- the C mirror ---------------------------------------------------------------------------------------------------

# names the compiled modules use, in the order _layout.pxd declares them
PXD_NAMES = (
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "BLANK_MAGIC_CODE",
    "END_FILE_MIN_BLANK_LENGTH",
    "GAP_SIGNATURE",
    "GAP_RECORD_SIZE",
    "REC_TOTAL_SIZE",
    "REC_MAGIC",
    "REC_BODY_CRC",
    "REC_QUEUE_ID",
    "REC_FLAG",
    "REC_QUEUE_OFFSET",
    "REC_PHYSICAL_OFFSET",
    "REC_SYS_FLAG",
    "REC_BORN_TIMESTAMP",
    "REC_BORN_HOST",
    "HOST_V4_SIZE",
    "HOST_V6_SIZE",
    "REC_MIN_SIZE",
    "BODY_CRC_MASK",
    "MAX_TOPIC_BYTES",
    "MAX_TOPIC_BYTES_V2",
    "MAX_TOPIC_NAME_BYTES",
    "MAX_PROPERTIES_SIZE",
    "PROPERTY_NAME_SEP",
    "PROPERTY_SEP",
    "SYSFLAG_COMPRESSED",
    "SYSFLAG_MULTI_TAGS",
    "SYSFLAG_TRANSACTION_MASK",
    "SYSFLAG_TRANSACTION_NOT_TYPE",
    "SYSFLAG_TRANSACTION_PREPARED",
    "SYSFLAG_TRANSACTION_COMMIT",
    "SYSFLAG_TRANSACTION_ROLLBACK",
    "SYSFLAG_BORNHOST_V6",
    "SYSFLAG_STOREHOST_V6",
    "CQ_UNIT_SIZE",
    "CQ_BLANK_UNIT_SIZE",
    "CQ_EXT_ADDRESS_MAX",
    "INDEX_HEADER_SIZE",
    "INDEX_H_BEGIN_TS",
    "INDEX_H_END_TS",
    "INDEX_H_BEGIN_PHY",
    "INDEX_H_END_PHY",
    "INDEX_H_SLOT_COUNT",
    "INDEX_H_INDEX_COUNT",
    "INDEX_SLOT_SIZE",
    "INDEX_ITEM_SIZE",
    "INDEX_MAX_KEY_BYTES",
    "OS_PAGE_SIZE",
    "FILE_NAME_DIGITS",
    "MAX_QUEUE_ID",
    "QUEUE_SNAPSHOT_NOT_VOUCHED",
    "QUEUE_SNAPSHOT_TOPIC_ROW_SIZE",
    "QUEUE_SNAPSHOT_QUEUE_ROW_SIZE",
    "QUEUE_SNAPSHOT_FILE_ROW_SIZE",
    "FRAME_MAGIC",
    "FRAME_HEADERS_SIZE",
    "FRAME_OVERHEAD",
) + tuple(name for name, value in list(globals().items()) if name.startswith("CTL_") and isinstance(value, int))


def pxd_source() -> str:
    """The text of ``localmq/_layout.pxd``: every PXD_NAMES value as a C constant (int64 where int32 is too small)."""
    lines = [
        "# Generated by setup.py from localmq/layout.py (layout.pxd_source): do not edit; edit layout.py.",
        "from libc.stdint cimport int64_t",
        "",
        "cdef extern from *:",
        '    """',
    ]
    decl = []
    for name in PXD_NAMES:
        value = globals()[name]
        if -(1 << 31) <= value < (1 << 31):
            lines.append(f"    #define LMQ_L_{name} ({value})")
            decl.append(f'    enum: {name} "LMQ_L_{name}"')
        else:
            lines.append(f"    #define LMQ_L_{name} ((int64_t){value}LL)")
            decl.append(f'    const int64_t {name} "LMQ_L_{name}"')
    lines.append('    """')
    return "\n".join(lines + decl) + "\n"
