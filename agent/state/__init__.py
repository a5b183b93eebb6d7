"""What the agent keeps of itself between runs, and how it checks it: where every source stands,
the loss journal, the state folder's health, the room left on its disk.

- ``db``: the state database: file checkpoints, one row per generation of content, the
  producer tier's tallies, the identity (incarnation, next record number).
- ``checkpoints``: where each source stands, sealed and acknowledged, on its way there.
- ``selfcheck``: at start, every byte the checkpoints call sealed still accounted for.
- ``journal``: the loss journal: every event not delivered, durably, with why.
- ``numbers``: with ``sync_on_seal`` off, a durable bound past every record number given, so
  a start after a power loss gives none of them to another line.
- ``folder``: a damaged state database or pool file, at start and under the running agent.
- ``diskguard``: free space on the state folder: reading pauses when it runs out.
"""
