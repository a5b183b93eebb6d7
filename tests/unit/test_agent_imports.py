"""The agent runs on producer hosts without the audit pipeline's Spark side: importing it loads
neither PySpark (nor py4j) nor any module of the Spark jobs (``audit.jobs``): of ``audit/`` it
needs only the contract (``audit.contract``). Nor pandas or pyarrow, although this venv has them
for the jobs: they cost the agent ~60 MB of resident memory. Nor sqlite-utils (the reconciler's):
the state database is plain ``sqlite3``, and sqlite-utils with what it imports (pluggy, click,
dateutil) took 60–85 ms of every agent start (docs/performance.md). Nor apscheduler (the
reconciler's schedule): the audit emitter's rounds run on the agent's monotonic clock."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_agent_loads_no_pyspark_nor_pandas_nor_sqlite_utils_nor_apscheduler():
    code = ("import sys, agent.service, agent.cli\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('pyspark', 'py4j', 'pandas', 'pyarrow',\n"
            "                                    'sqlite_utils', 'apscheduler')\n"
            "             or m == 'audit.jobs' or m.startswith('audit.jobs.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
