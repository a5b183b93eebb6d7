"""Drain: sealed slots → Kafka, in sequence order; a slot is freed once every record in it is
acknowledged.

- ``drain``: the sending, the delivery outcomes per slot, liveness (outages and a producer
  that stalls), refused topics.
- ``probe``: does the cluster answer? Asked by a new client, never the producer in question.
- ``native``: the native send path (``broker.send_path``: ``auto`` where the extension is
  installed, or ``native``), and the choice of path: slots handed to the extension built from
  agent/native, outcomes reported once per slot.
- ``delivered``: the native path's start check: which records in flight when the agent died
  Kafka took all the same (read back, left out of the send).
- ``transact``: exactly once (``broker.delivery = "exactly_once"``): slots in Kafka
  transactions with the agent's progress marker; a restart frees what the marker names.
- ``native_txn``: the same transactions on the native send path: the extension's hand-over
  and its transaction calls under ``transact``'s rules.
- ``slotsend``: one slot on its way: the cursor over its records and what became of each.
- ``headers``: the records' identity headers, built per block.
- ``deadletter``: records refused for good, written durably to ``dead-letter/``.
- ``outcome``: every Kafka result reduced to ok / retry / alone / denied / dead, in one place.
- ``producer``: the producer's configuration (acks, idempotence, batching, security).
- ``topics``: the topic check: which of the agent's topics the cluster does not have.
"""
