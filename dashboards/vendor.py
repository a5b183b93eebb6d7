"""The dashboard's front-end libraries, vendored from npm into ``static/vendor``.

The pages load htmx (auto-refresh, the alert forms) and uPlot (the topic page's chart) from the
package's own static files: no CDN, so the dashboard works offline and no page makes a request
off its host. The files are checked in; ``python -m dashboards.vendor`` fetches them again with
``npm pack`` at the pinned versions, refuses a tarball whose integrity differs from the pin,
and rewrites ``MANIFEST.json`` (the SHA-256 of each file, checked by the tests).
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR = Path(__file__).parent / "static" / "vendor"

# package -> (version, npm's integrity of the tarball, files taken from it)
PINS = {
    "htmx.org": ("2.0.11",
                 "sha512-Thx/WtpeOQqSrqBCw/A1cwGJGg4UrVa3+sW0GmrM3p4gJgO89ecH4qtbnyzDDWFvBTqjnI"
                 "MCgELTNt636dtamA==",
                 ["dist/htmx.min.js", "LICENSE"]),
    "uplot": ("1.6.32",
              "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3"
              "tOkyTxpiQIw==",
              ["dist/uPlot.iife.min.js", "dist/uPlot.min.css", "LICENSE"]),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest() -> dict:
    return json.loads((VENDOR / "MANIFEST.json").read_text())


def fetch(work: Path) -> dict:
    files = {}
    for name, (version, integrity, members) in PINS.items():
        out = subprocess.run(["npm", "pack", f"{name}@{version}", "--json"], cwd=work,
                             check=True, capture_output=True, text=True).stdout
        tarball = work / json.loads(out)[0]["filename"]
        raw = hashlib.sha512(tarball.read_bytes()).digest()
        digest = "sha512-" + base64.b64encode(raw).decode()
        if digest != integrity:
            raise SystemExit(f"{name}@{version}: npm served {digest}, pinned {integrity}")
        with tarfile.open(tarball) as tar:
            for member in members:
                data = tar.extractfile(f"package/{member}").read()
                target = VENDOR / name / Path(member).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                files[f"{name}/{target.name}"] = sha256(target)
    return {"packages": {n: {"version": v, "integrity": i} for n, (v, i, _) in PINS.items()},
            "files": files}


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        found = fetch(Path(work))
    (VENDOR / "MANIFEST.json").write_text(json.dumps(found, indent=2) + "\n")
    print(f"vendored {', '.join(f'{n}@{v[0]}' for n, v in PINS.items())} into {VENDOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
