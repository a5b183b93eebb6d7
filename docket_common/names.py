"""The names and defaults every tier spells the same way (DESIGN.md, "Audit record" and
"Record identity"): the audit topic, the reconciler's group, the headers on every record.
The window is a concept of its own: ``docket_common.window``.

The agent sets the headers on each record it sends to Kafka; the Spark jobs read them back to
count per origin and record number. A rename here is a change of the contract between tiers.
"""

AUDIT_TOPIC = "docket.audit"                # the audit topic's default name
RECONCILE_GROUP = "docket-reconcile"        # the reconciler's consumer group (its ACL's too)

# Record headers.
ORIGIN_HEADER = "docket-origin"             # the agent id (UTF-8)
INCARNATION_HEADER = "docket-incarnation"   # the origin's incarnation (UTF-8)
SEQ_HEADER = "docket-seq"                   # the origin's record number: 8 bytes, big-endian
PART_HEADER = "docket-part"                 # "i/n": a part of a line split in n records
CONTINUED_HEADER = "docket-continued"       # "1": the rest of a multiline event cut before it

# An emitter (or an origin's records) without an incarnation, where one must be named.
NO_INCARNATION = "-"
