"""PNG plots of a perf run: throughput beside the peers, put latency percentiles, scaling with processes, and
recovery time against the size of the log.

Usage:
    python -m pytest perf/test_queue_bench.py perf/test_shared_bench.py perf/test_recovery_bench.py \
        --benchmark-only --benchmark-json=perf/results/bench.json
    python perf/plots.py perf/results/bench.json [out directory, default perf/plots]

Each figure is drawn from one run's JSON, so the bars beside each other come from the same machine and moment.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

PALETTE = {"localmq": "#1f77b4"}


def _color(name, i):
    return PALETTE.get(name, plt.get_cmap("tab10")((i % 9) + 1))


def _benchmarks(path):
    with open(path) as f:
        return json.load(f)["benchmarks"]


def throughput(benches, out):
    """Grouped bars: msgs/s of each implementation for put, put_batch_1000 and read, 100 B and 1 KiB (log scale)."""
    rows = [b for b in benches if b.get("extra_info", {}).get("scenario") in ("put", "put_batch_1000", "read")]
    if not rows:
        return None
    groups = sorted(
        {(b["extra_info"]["scenario"], b["extra_info"]["body_size"]) for b in rows},
        key=lambda g: (("put", "put_batch_1000", "read").index(g[0]), g[1]),
    )
    impls = sorted({b["extra_info"]["implementation"] for b in rows}, key=lambda n: (n != "localmq", n))
    rate = {
        (b["extra_info"]["scenario"], b["extra_info"]["body_size"], b["extra_info"]["implementation"]): b["extra_info"][
            "messages"
        ]
        / b["stats"]["median"]
        for b in rows
    }
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        xs = [g + i * width for g in range(len(groups))]
        ys = [rate.get((s, n, impl), 0) for s, n in groups]
        ax.bar(xs, ys, width, label=impl, color=_color(impl, i))
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{s}\n{n} B" if n < 1024 else f"{s}\n{n // 1024} KiB" for s, n in groups])
    ax.set_yscale("log")
    ax.set_ylabel("messages / s (median round, log scale)")
    ax.set_title("localmq beside the queues a Python user would pick instead (same run)")
    ax.legend(fontsize=8, ncol=4)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out, "throughput.png")


def latency(benches, out):
    """Put latency percentiles (µs, log scale) per implementation, 100 B."""
    rows = [b for b in benches if "latency_us" in b.get("extra_info", {})]
    if not rows:
        return None
    rows.sort(key=lambda b: (b["extra_info"]["implementation"] != "localmq", b["extra_info"]["implementation"]))
    pcts = ["50", "90", "99", "99.9"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(rows)
    for i, b in enumerate(rows):
        name = b["extra_info"]["implementation"]
        ys = [b["extra_info"]["latency_us"][p] for p in pcts]
        ax.bar([k + i * width for k in range(len(pcts))], ys, width, label=name, color=_color(name, i))
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(pcts))])
    ax.set_xticklabels([f"p{p}" for p in pcts])
    ax.set_yscale("log")
    ax.set_ylabel("µs per put (log scale)")
    ax.set_title("Latency of one 100-byte put")
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out, "latency.png")


def scaling(benches, out):
    """Aggregate put msgs/s against the number of processes writing one store (perf/test_shared_bench.py)."""
    rows = [b for b in benches if "procs" in b.get("extra_info", {}) and "threads" not in b["extra_info"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    impls = sorted({b["extra_info"]["impl"] for b in rows}, key=lambda n: (not n.startswith("localmq"), n))
    for i, impl in enumerate(impls):
        pts = sorted(
            (b["extra_info"]["procs"], b["extra_info"]["msgs_per_s"]) for b in rows if b["extra_info"]["impl"] == impl
        )
        ax.plot(
            [p for p, _ in pts],
            [r for _, r in pts],
            marker="o",
            label=impl,
            color=_color("localmq" if impl == "localmq_shared" else impl, i),
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("processes putting into one store")
    ax.set_ylabel("messages / s, all processes (log scale)")
    ax.set_title("Many processes, one store (2 vCPU)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out, "scaling.png")


def recovery(benches, out):
    """Open (recovery) time against the size of the log, normal and abnormal (perf/test_recovery_bench.py)."""
    rows = [b for b in benches if b.get("extra_info", {}).get("scenario") == "recovery_by_size"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, mode in enumerate(("normal", "abnormal")):
        pts = sorted(
            (b["extra_info"]["log_bytes"] / 2**20, b["stats"]["median"])
            for b in rows
            if b["extra_info"]["mode"] == mode
        )
        label = f"{mode} (abort {'absent' if i == 0 else 'present'})"
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label)
    ax.set_xlabel("log size (MiB)")
    ax.set_ylabel("seconds to open (median)")
    ax.set_title("Recovery time against the size of the log (CRC checked)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out, "recovery.png")


def _save(fig, out, name):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = argv[2] if len(argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "plots")
    benches = _benchmarks(argv[1])
    for fn in (throughput, latency, scaling, recovery):
        path = fn(benches, out)
        print(f"{fn.__name__}: {path or 'no data in this run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
