"""Print the msgs/s, MB/s and localmq/peer table from the rows the benchmarks record or from --benchmark-json.

Usage: ``python perf/report.py bench.json`` (the file written by ``pytest perf/ --benchmark-json=bench.json``).
"""

import json
import sys

SCENARIOS = [
    "put",
    "put_batch_1000",
    "read",
    "decode_range",
    "sync_put_1_threads",
    "sync_put_4_threads",
    "sync_put_16_threads",
]
REFERENCE = "localmq"


def row_from_extra_info(info, seconds):
    """One table row from a benchmark's extra_info and the median seconds of one round."""
    return {
        "scenario": info["scenario"],
        "body_size": info["body_size"],
        "implementation": info["implementation"],
        "messages": info["messages"],
        "body_bytes": info["body_bytes"],
        "seconds": seconds,
        "caveat": info.get("caveat", ""),
    }


def rows_from_json(path):
    """Rows of a pytest-benchmark JSON file, using each benchmark's median round time."""
    with open(path) as f:
        data = json.load(f)
    rows = [
        row_from_extra_info(b["extra_info"], b["stats"]["median"])
        for b in data["benchmarks"]
        if "scenario" in b.get("extra_info", {})
    ]
    # peers timed outside pytest-benchmark (test_jvm_bench.py: the JVM's own rounds) carry their rows whole
    for b in data["benchmarks"]:
        rows.extend(dict(r) for r in b.get("extra_info", {}).get("peer_rows", ()))
    return rows


def _size_label(n):
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def format_table(rows):
    """The table as a list of lines; ratio = localmq msgs/s / this row's msgs/s, in the same scenario and size."""
    order = {s: i for i, s in enumerate(SCENARIOS)}
    ref = {}
    for r in rows:
        r["msgs_s"] = r["messages"] / r["seconds"]
        r["mb_s"] = r["body_bytes"] / r["seconds"] / 1e6
        if r["implementation"] == REFERENCE:
            ref[(r["scenario"], r["body_size"])] = r["msgs_s"]
    # scenarios outside SCENARIOS (Spark's, the index's) stay grouped by name, localmq first in each group
    rows = sorted(
        rows,
        key=lambda r: (
            order.get(r["scenario"], 99),
            r["scenario"],
            r["body_size"],
            r["implementation"] != REFERENCE,
            -r["msgs_s"],
        ),
    )
    head = ("scenario", "body", "implementation", "msgs/round", "msgs/s", "MB/s", "localmq/peer")
    table = [head]
    for r in rows:
        base = ref.get((r["scenario"], r["body_size"]))
        ratio = f"{base / r['msgs_s']:.2f}" if base else "n/a"
        table.append(
            (
                r["scenario"],
                _size_label(r["body_size"]),
                r["implementation"],
                f"{r['messages']:,}",
                f"{r['msgs_s']:,.0f}",
                f"{r['mb_s']:,.1f}",
                ratio,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    right = {3, 4, 5, 6}
    lines = []
    for k, row in enumerate(table):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("msgs/s and MB/s (10^6 body bytes) from the median round; localmq/peer > 1 means localmq is faster.")
    for r in rows:
        if r.get("caveat"):
            lines.append(f"note: {r['scenario']} {_size_label(r['body_size'])} {r['implementation']}: {r['caveat']}")
    return lines


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("\n".join(format_table(rows_from_json(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
