"""The docket audit dashboard, and the Prometheus and Grafana assets for shops that use them.

- ``app``: the pages and the JSON API (Starlette), over the reconciler's database.
- ``data``: what the pages show, read from the database (completeness, hops, alerts, health).
- ``cli``: the ``docket-dashboard`` command.
- ``vendor``: the front-end libraries (htmx, uPlot) vendored from npm into ``static/vendor``.
"""
