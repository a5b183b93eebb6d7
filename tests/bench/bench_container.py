"""Container log files: docket reading a CRI file (``format = "cri"``) beside docket reading the
same file as plain lines and rsyslog's ``imfile`` joining CRI partial lines with
``endmsg.regex``, on the same broker in the same run.

ENTRIES entries written beforehand to one file as containerd writes them (``<time> <stream>
<P|F> <text>``; seeded: one entry in ten cut into 2–3 partial lines, texts of 40–400 bytes).
Each shipper sends them to a topic of its own (3 partitions) and is timed from its process's
start until Kafka holds every record, with its CPU time (``bench_peers.Watched``):

- docket_cri: ``docket-agent run`` (the throughput configuration of ``bench_agent.py``) with
  ``format = "cri"``: framing removed, parts joined, each entry one JSON record (time, stream,
  message);
- docket_native_cri: the same on the native send path, when it is built;
- docket_lines: the same file without ``format``: every line a record as written (what the
  framing costs per line);
- rsyslog: Debian's ``rsyslogd`` with ``imfile`` and ``endmsg.regex`` matching a CRI ``F`` line
  (rsyslog's way of joining CRI partial lines: the framing of every part stays in the message,
  no JSON is made — less work than docket's) → ``omkafka`` (acks=all, snappy), as
  ``bench_peers.py`` runs it.

docket_cri's records are compared with the entries written (every entry exactly once, whole).
Ratios: docket's events/s over rsyslog's and CPU per event over rsyslog's; docket_cri's CPU
per line over docket_lines'. Prints one JSON line. Uses ``KAFKA_BOOTSTRAP`` when set, else
starts a 1-broker local cluster.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import compile_sources, native_built  # noqa: E402
from tests.bench.bench_multiline import (  # noqa: E402
    rsyslog_usable,
    run_docket,
    run_rsyslog,
    vs_rsyslog,
)
from tests.kafkautil import bench_kafka, read_all  # noqa: E402

ENTRIES = 200_000
RUN = int(time.time())
# imfile: a message ends with a line whose tag is F (its newlines kept, as the parts' lines).
CRI_FRAMING = 'endmsg.regex="^[^ ]+ (stdout|stderr) F " escapeLF="off" readTimeout="1"'


def write_entries(path: Path) -> tuple[list[str], int]:
    """The entries' texts, and the lines written for them."""
    rnd = random.Random(20261203)
    texts, out, lines = [], [], 0
    for i in range(ENTRIES):
        stamp = f"2026-12-03T21:{i // 6000 % 60:02d}:{i // 100 % 60:02d}.{i:09d}Z"
        stream = "stderr" if i % 7 == 0 else "stdout"
        text = f"id-{i:07d} " + "".join(rnd.choices("abcdefghij ", k=rnd.randint(30, 390)))
        texts.append(text)
        cuts = sorted(rnd.sample(range(1, len(text)), rnd.randint(1, 2))) \
            if rnd.random() < 0.1 else []
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        for j, piece in enumerate(pieces):
            out.append(f"{stamp} {stream} {'F' if j == len(pieces) - 1 else 'P'} {piece}\n")
        lines += len(pieces)
    path.write_text("".join(out))
    return texts, lines


def main() -> None:
    native = native_built()
    with tempfile.TemporaryDirectory(prefix="bench-container-") as d:
        compile_sources()
        work = Path(d)
        data = work / "0.log"
        texts, lines = write_entries(data)
        size = data.stat().st_size
        runs = ["docket_cri", "docket_lines"] + (["docket_native_cri"] if native else []) + \
            (["rsyslog"] if rsyslog_usable() else [])
        with bench_kafka(work) as bootstrap:
            topics = {r: f"bench.container.{r}.{RUN}" for r in runs}
            ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in topics.values()])
            out: dict = {}
            for r in runs:
                if r == "rsyslog":
                    out[r] = run_rsyslog(bootstrap, topics[r], work / r, data, lines,
                                         CRI_FRAMING, ENTRIES)
                    continue
                fmt = None if r == "docket_lines" else "cri"
                out[r] = run_docket(bootstrap, topics[r], work / r, data,
                                    lines if fmt is None else ENTRIES, lines,
                                    {"format": fmt} if fmt else {},
                                    "native" if "native" in r else "python", ENTRIES)
                if fmt is not None:
                    got = sorted(json.loads(m.value())["message"]
                                 for m in read_all(bootstrap, topics[r]))
                    out[r]["every_entry_once_whole"] = got == sorted(texts)
    figures = {"bench": "container", "entries": ENTRIES, "lines": lines,
               "bytes": size, **out}
    figures.update(vs_rsyslog(out))
    figures["cri_cpu_per_line_vs_lines"] = round(
        out["docket_cri"]["cpu_us_per_line"] / out["docket_lines"]["cpu_us_per_line"], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
