"""The docket host agent.

Data flows through its subpackages in order: ``tail`` (sources) → ``buffer`` (the crash-safe,
mmap'd slot pool) → ``drain`` (Kafka). See docs/architecture.md.
"""
