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


def rss_kib() -> int:
    """Resident set size of this process, KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
