"""``make demo``: the whole docket pipeline on this machine, in LinkedIn's topology. Not
installed with docket: it runs from a checkout, with the checkout's virtualenv.

- ``run``: ``python -m demo up / down / fault``: both clusters, the mirror, three hosts with
  their agents, the Spark jobs, the reconciler, the dashboard; the fault drills.
- ``generator``: an application writing rotated JSON logs, one per simulated host.
- ``receiver``: the alert receiver the reconciler notifies (a webhook on 127.0.0.1).
"""
