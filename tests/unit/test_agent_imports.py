"""The agent runs on producer hosts without the audit pipeline's Spark side: importing it loads
neither PySpark (nor py4j) nor any module of the Spark jobs (``audit.jobs``): of ``audit/`` it
needs only the contract (``audit.contract``). (pandas is not checked: sqlite-utils imports it
when it is installed, as it is in this development venv; a producer host installs the agent
without the ``audit`` extras, which bring it.)"""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_agent_loads_no_pyspark():
    code = ("import sys, agent.service, agent.cli\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')\n"
            "             or m == 'audit.jobs' or m.startswith('audit.jobs.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
