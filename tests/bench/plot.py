"""Draw the benchmarks' JSON lines as one PNG: throughput per shipper and latency per path.

    python tests/bench/plot.py RESULTS.jsonl OUT.png

RESULTS.jsonl holds the lines the benchmarks print (``make bench`` collects them in
``build/bench/results.jsonl``); lines of other benchmarks, and anything that is not JSON, are
left out. Left: events/s from ``bench_peers.py`` (each shipper from process start, best run)
and ``bench_agent.py`` (the agent and the bare client loops). Right: p50, p99 and p99.9 from
append to a consumer's receipt at 1,000 lines/s (``bench_latency.py``, ``bench_peers.py``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

THROUGHPUT = {            # (bench, key) → label
    ("agent_tail_to_kafka", "agent_events_s"): "docket agent (bench_agent)",
    ("agent_tail_to_kafka", "bare_positional_events_s"): "bare loop, positional (bench_agent)",
    ("agent_tail_to_kafka", "bare_events_s"): "bare loop, keywords (bench_agent)",
    ("agent_tail_to_kafka", "bare_cb_events_s"): "bare loop + callback (bench_agent)",
}
LATENCY = re.compile(r"^(\w+)_p(50|99|999)_ms$")
PATHS = {"agent": "docket", "direct": "produce directly"}


def read(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "bench" in row:
            out.append(row)
    return out


def throughput(rows: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in rows:
        if row["bench"] == "peers":
            for shipper, best in row.get("best", {}).items():
                out[f"{shipper} from start (bench_peers)"] = best["events_s"]
        for (bench, key), label in THROUGHPUT.items():
            if row["bench"] == bench and key in row:
                out[label] = row[key]
    return out


def latency(rows: list[dict]) -> dict[str, dict[str, float]]:
    """path → {"p50": ms, "p99": ms, "p99.9": ms}, named after the benchmark it came from."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        if row["bench"] not in ("latency", "peers"):
            continue
        for key, value in row.items():
            m = LATENCY.match(key)
            if m and m.group(1) != "target":
                q = {"50": "p50", "99": "p99", "999": "p99.9"}[m.group(2)]
                path = PATHS.get(m.group(1), m.group(1))
                out.setdefault(f"{path} ({row['bench']})", {})[q] = value
    return out


def draw(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp, lat = throughput(rows), latency(rows)
    if not tp and not lat:
        raise SystemExit("plot.py: no throughput or latency figures in the input")
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    names = sorted(tp, key=tp.get)
    left.barh(names, [tp[n] / 1000 for n in names],
              color=["tab:blue" if n.startswith("docket") else "tab:gray" for n in names])
    left.set_xlabel("thousand events/s (100-byte lines)")
    left.set_title("Throughput, file → Kafka, acknowledged")
    for i, n in enumerate(names):
        left.text(tp[n] / 1000, i, f" {tp[n] / 1000:,.0f}k", va="center", fontsize=8)
    paths = sorted(lat)
    width = 0.27
    for k, q in enumerate(("p50", "p99", "p99.9")):
        right.bar([i + (k - 1) * width for i in range(len(paths))],
                  [lat[p].get(q, 0) for p in paths], width, label=q)
    right.set_xticks(range(len(paths)), paths, rotation=20, ha="right", fontsize=8)
    right.set_ylabel("ms, append → consumer (1,000 lines/s)")
    right.set_yscale("log")
    right.set_title("Latency (targets for docket: p50 10 ms, p99 50 ms)")
    for ms in (10, 50):
        right.axhline(ms, color="black", linewidth=0.6, linestyle=":")
    right.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: plot.py RESULTS.jsonl OUT.png")
    draw(read(Path(sys.argv[1])), Path(sys.argv[2]))


if __name__ == "__main__":
    main()
