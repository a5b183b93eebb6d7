"""Point the extension's build at the librdkafka the Python client ships, so that both send
paths run one librdkafka (one version, one set of features, one copy in the process).

confluent-kafka's wheel carries librdkafka as ``confluent_kafka.libs/librdkafka-<hash>.so.1``
(named so by auditwheel; that name is also its soname). Run by the venv's interpreter, this
writes into ``OUT``:

- ``librdkafka.so``, a link to that file, so that ``-lrdkafka`` finds it; the extension then
  needs the library under its soname, which the loader finds through the extension's run path
  (``$ORIGIN/../confluent_kafka.libs``, set by ``build.rs``): the two packages are installed
  side by side in one ``site-packages``, in the venv and in the .deb's alike;
- ``rdkafka.pc``, which the rdkafka crate's build asks ``pkg-config`` for (its
  ``dynamic-linking`` feature), with the version the Python client reports.

Usage: ``python packaging/link_librdkafka.py OUT`` (``make native`` runs it), then the build
with ``PKG_CONFIG_PATH=OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path


def shipped_library() -> tuple[Path, str]:
    """The Python client's librdkafka file and its version; SystemExit naming what is wrong."""
    try:
        import confluent_kafka
    except ImportError:
        raise SystemExit("link_librdkafka: confluent-kafka is not installed in this "
                         "interpreter's environment (make setup installs it)") from None
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if len(found) != 1:
        raise SystemExit(f"link_librdkafka: expected one librdkafka in {libs}, found "
                         f"{[p.name for p in found] or 'none'} (a confluent-kafka wheel for "
                         f"Linux ships it there; one built from source does not)")
    return found[0], confluent_kafka.libversion()[0]


def write(out: Path) -> Path:
    library, version = shipped_library()
    out.mkdir(parents=True, exist_ok=True)
    link = out / "librdkafka.so"
    link.unlink(missing_ok=True)
    link.symlink_to(library)
    (out / "rdkafka.pc").write_text(
        f"libdir={out.resolve()}\n\n"
        "Name: librdkafka\n"
        "Description: the librdkafka that confluent-kafka's wheel ships\n"
        f"Version: {version}\n"
        "Libs: -L${libdir} -lrdkafka\n"
        "Cflags:\n")
    return library


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(f"librdkafka for the extension: {write(Path(sys.argv[1]))}")
