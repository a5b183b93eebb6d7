"""Jars from Maven Central: ``mvn dependency:copy-dependencies`` of a pom into a cache folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:          # the caller passes its own error class; nothing imported at run time
    from docket_common.errors import DocketError


def fetch_with_maven(pom: Path, libs: Path, marker: str, what: str, *,
                     error: type[DocketError], quiet: bool = True) -> None:
    """Copy the dependencies ``pom`` names into ``libs`` (``-Dlibs=DIR`` in the pom), all or
    nothing: a half-finished copy stays in ``libs.partial`` and never passes for the real one."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(
            f"the {what} jars are not in {libs} and `mvn` is not installed",
            hint="install Maven (apt-get install maven) or point the environment variable "
            "for this folder at a copy of the jars",
        )
    partial = libs.with_name(libs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies", f"-Dlibs={partial}"]
    if quiet:
        cmd.insert(1, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (partial / marker).is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise error(
            f"fetching {what} from Maven Central failed (mvn exit {proc.returncode}):\n{tail}",
            hint="check that Maven Central is reachable; the command was: " + " ".join(cmd),
        )
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
