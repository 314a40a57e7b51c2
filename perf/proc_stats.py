"""What this process holds, read from /proc (Linux): descriptors, mappings, RSS. Shared by the many-queues and soak
benchmarks."""

import os


def fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def maps() -> int:
    """Mappings of this process (lines of /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def rss_kib() -> int:
    """Resident set size of this process, KiB: anonymous memory (the heap) plus the resident pages of mapped files
    (the store's segments and queue files among them) plus shared memory."""
    return _status_kib("VmRSS:")


def rss_anon_kib() -> int:
    """The anonymous part of the RSS, KiB (RssAnon: the heap; what a leak grows)."""
    return _status_kib("RssAnon:")


def rss_file_kib() -> int:
    """The file-backed part of the RSS, KiB (RssFile: resident pages of mapped files, the page cache's, bounded by
    the mappings and reclaimable)."""
    return _status_kib("RssFile:")
