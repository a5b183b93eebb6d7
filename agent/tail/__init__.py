"""Sources: where events come from, read into the buffer pool.

- ``files``: the file source: at every scan, what each file under a source's globs is, read
  through the next three, with the state database kept true.
- ``discovery``: the globs' regular files by identity, and inodes that left them while stopped.
- ``generations``: streams of file content, and how a file found is matched to one.
- ``reader``: one open file read into the pool: whole lines, large reads, checked after.
- ``anchors``: what a file held before the offsets it was sealed to: whether it still holds it.
- ``compressed``: a compressor's magic at a file's start: such a file is never read as lines.
- ``seams``: the file source's only contact with the file system and time (``FsOps``).
- ``watch``: a folder watch (watchdog) that wakes the agent's loop when a tailed folder changes.
- ``sock``: the socket source, a unix stream socket of newline-delimited events; the way every
  listening source appends into the pool (``PoolFeed``: backpressure).
- ``syslog``: the syslog source: TCP (RFC 6587, TLS optional) and UDP listeners (drops counted).
- ``syslog_format``: syslog frames out of a TCP stream and RFC 5424/3164 messages into fields.
- ``journald``: the journald source: journalctl's entries, the journal's cursor as checkpoint,
  entries vacuumed before they were read journalled.
- ``journal_export``: journalctl's export format cut into entries as it comes.
- ``lines``: bytes into records for every source: the line cap, the oddities counted, two walks.
- ``multiline``: which lines begin an event and which continue one (RE2 patterns, presets).
- ``events``: the event time and key taken out of JSON lines, when a source names the fields.
- ``container``: container runtimes' log files (CRI, docker json-file): framing removed, partial
  lines joined, the pod, namespace and container from the file's path.
"""
