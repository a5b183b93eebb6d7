"""The agent runs on producer hosts without the audit pipeline's Spark side: importing it loads
neither PySpark (nor py4j) nor any module of the Spark jobs (``audit.jobs``): of ``audit/`` it
needs only the contract (``audit.contract``). Nor pandas or pyarrow, although this venv has them
for the jobs and sqlite-utils imports pandas when it can: they cost the agent ~60 MB of resident
memory."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_agent_loads_no_pyspark_nor_pandas():
    code = ("import sys, agent.service, agent.cli\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('pyspark', 'py4j', 'pandas', 'pyarrow')\n"
            "             or m == 'audit.jobs' or m.startswith('audit.jobs.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_pandas_still_imports_after_the_agent_state_module():
    code = ("import agent.state, pandas, sqlite_utils\n"
            "print(pandas.DataFrame({'a': [1]}).shape)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "(1, 1)", out.stdout
