"""The docket host agent.

Data flows through its subpackages in order: ``tail`` (sources) → ``buffer`` (the crash-safe,
mmap'd slot pool) → ``drain`` (Kafka). See docs/architecture.md, and its "Layers" for what may
import what.

- ``tail``: the sources — files under globs, a unix socket, syslog over TCP and UDP — read
  into the pool.
- ``buffer``: the pool file of slots, sealed, drained in order and freed once acknowledged.
- ``drain``: sealed slots to Kafka, every Kafka outcome reduced to ok / retry / denied / dead.
- ``config``: every setting declared once; parsing, defaults, validation, docs/config.md.
- ``globs``: the folder a glob pattern lives in (the configuration's checks, the folder watch).
- ``patterns``: multiline rules as configured: presets, checks, RE2's compile.
- ``routing``: topic and key templates over an event's fields (``"syslog.{app}"``).
- ``state``: what the agent keeps between runs: the state database, the checkpoints, the
  start self-check, the loss journal, the state folder's health, the disk's free space.
- ``audit_emitter``: the producer tier of the audit, counted at seal and emitted.
- ``service``: the running agent: sources → pool → drain, wired (``Agent``).
- ``loop``: its loop: read, seal, checkpoint, send, serve reports; sleep when nothing comes.
- ``control``: signals, a reload (SIGHUP), a graceful stop, a pool lost under the agent.
- ``wake``: what ends the loop's sleep when it has nothing to do (writes, a stop, a signal).
- ``errors``: why the agent cannot start here (``StartupError``).
- ``status``: what it says of itself: gauges, the ``/status`` document, the HTTP server.
- ``telemetry``: the agent's metrics, named once (docs/telemetry.md).
- ``logs``: the log output, text or JSON lines, repeated lines held back.
- ``notify``: systemd's notify protocol over ``$NOTIFY_SOCKET``.
- ``preflight``: what ``validate`` checks beyond the file's form.
- ``cli``: the ``docket-agent`` command.
"""

import os

# numpy's OpenBLAS starts a thread for each further core when numpy is imported, and each spins
# some 50 ms of CPU looking for work before it sleeps: on every start of every docket-agent
# command. The agent calls no BLAS routine (no dot, matmul or linalg), so one thread, the
# caller's, is all it needs. A value set in the environment is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

