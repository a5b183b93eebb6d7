"""Build the one Kafka client both send paths run: librdkafka with every sign-in docket
supports (SCRAM, OAUTHBEARER with OIDC through libcurl, Kerberos through Cyrus SASL's GSSAPI),
TLS and zstd, and confluent-kafka compiled against it, as a wheel that carries that librdkafka.

confluent-kafka's own Linux wheels ship a librdkafka built without GSSAPI, so Kerberos needs a
build of our own. Both come from pinned sources:

- librdkafka's source as Confluent publishes it inside its JavaScript client's npm package
  (``deps/librdkafka``; the newest librdkafka source any registry this build may use carries),
  checked against its SHA-256;
- confluent-kafka's sdist from PyPI, of the same minor version (its C code refuses an older
  librdkafka), checked by pip against its SHA-256 (``--require-hashes``). The tools pip fetches
  to build it (setuptools, wheel) are not pinned by hash: they make the wheel, none of them is
  in it.

The wheel written to ``OUT`` holds ``confluent_kafka.libs/librdkafka.so.1`` beside the package,
and the extension finds it through its run path, ``$ORIGIN/../confluent_kafka.libs`` and
nothing else (the interpreter's own link flags, which may name the build machine's library
folder, are left out): the same place auditwheel puts the library of a PyPI wheel, so
``link_librdkafka.py`` links the native send path to it unchanged. Needs a C compiler, make,
pkg-config, readelf and the development files of Cyrus SASL, OpenSSL, libcurl, zstd, lz4 and
zlib (``make setup`` installs them as root).

Usage: ``python packaging/build_kafka_client.py OUT`` (run by the venv's interpreter; ``make
setup`` then installs the wheel before everything else).
"""

from __future__ import annotations

import base64
import csv
import ctypes
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

LIBRDKAFKA_VERSION = "2.15.1"
SOURCE_URL = ("https://registry.npmjs.org/@confluentinc/kafka-javascript/-/"
              "kafka-javascript-1.10.1.tgz")
SOURCE_SHA256 = "ada7d703bb1d3237e2292bfabf438d663b6160c9f1ac2a2406b5dc4257c81b66"
SOURCE_DIR = "package/deps/librdkafka/"
CLIENT = "confluent-kafka==2.15.1"
CLIENT_SHA256 = "99d1223020e27854e75981333983c5120d64762268f8afcc805fbd62e7de49aa"   # the sdist
CONFIGURE = ("--enable-gssapi", "--enable-ssl", "--enable-curl", "--enable-zstd",
             "--enable-lz4-ext")
# What a build must report in its builtin.features, or it is refused here, not at a sign-in.
FEATURES = ("ssl", "sasl_gssapi", "sasl_scram", "sasl_oauthbearer", "oidc", "zstd")
LIBRARY = "librdkafka.so.1"
LIBS_DIR = "confluent_kafka.libs"
RUN_PATH = f"$ORIGIN/../{LIBS_DIR}"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "docket" / "librdkafka"


def source_archive() -> Path:
    """The pinned source archive, downloaded once into the cache and checked every time."""
    path = cache_dir() / SOURCE_URL.rsplit("/", 1)[1]
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        with urllib.request.urlopen(SOURCE_URL, timeout=120) as response, \
                open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
        partial.replace(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SOURCE_SHA256:
        path.unlink()
        raise SystemExit(f"build_kafka_client: {SOURCE_URL} has SHA-256 {digest}, expected "
                         f"{SOURCE_SHA256}: removed, nothing built")
    return path


def extract(archive: Path, into: Path) -> Path:
    """librdkafka's tree from the archive, alone, into ``into/librdkafka``."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(SOURCE_DIR) or not (member.isfile() or member.isdir()):
                continue
            member.name = "librdkafka/" + member.name[len(SOURCE_DIR):]
            members.append(member)
        for member in members:            # (Python before 3.11.4 has no extraction filter)
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts:
                raise SystemExit(f"build_kafka_client: {member.name!r} in the archive leaves "
                                 "its folder: nothing built")
            member.mode &= 0o755
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, members=members, **safe)
    return into / "librdkafka"


def build_library(tree: Path, prefix: Path) -> Path:
    """configure, make, make install into ``prefix``; the shared library's path."""
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["./configure", f"--prefix={prefix}", *CONFIGURE], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["make", "-j", jobs, "-C", "src", "lib"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["make", "-C", "src", "install"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)
    library = prefix / "lib" / LIBRARY
    subprocess.run(["strip", "--strip-unneeded", str(library)], check=True)
    return library


def build_client(prefix: Path, out: Path) -> Path:
    """confluent-kafka's wheel from its sdist, compiled and linked against ``prefix``."""
    env = dict(os.environ,
               CFLAGS=f"-I{prefix / 'include'}",
               LDSHARED=link_command(),
               LDFLAGS=f"-L{prefix / 'lib'} -Wl,-rpath,{RUN_PATH}")
    work = out / "sdist-build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pins = work / "requirements.txt"
    pins.write_text(f"{CLIENT} --hash=sha256:{CLIENT_SHA256}\n")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--require-hashes", "--no-binary", "confluent-kafka", "--no-cache-dir",
                    "--wheel-dir", str(work), "-r", str(pins)], env=env, check=True)
    (wheel,) = work.glob("confluent_kafka-*.whl")
    return wheel


def link_command() -> str:
    """The interpreter's command for linking an extension, without the library folders it
    names: a pyenv or self-built Python adds its own (``-L``, ``-Wl,-rpath``) to every
    extension's run path, where another librdkafka could be found first."""
    words = shlex.split(os.environ.get("LDSHARED") or sysconfig.get_config_var("LDSHARED")
                        or "gcc -shared")
    return shlex.join(w for w in words
                      if not w.startswith(("-L", "-Wl,-rpath", "-Wl,-R", "-R")))


def run_path(extension: Path) -> str:
    """The run paths ``readelf`` reads in ``extension``'s dynamic section, RPATH and RUNPATH
    both (joined by ``;`` when there are two)."""
    if shutil.which("readelf") is None:
        raise SystemExit("build_kafka_client: readelf (binutils) is needed to check the "
                         "extension's run path: install binutils")
    text = subprocess.run(["readelf", "-d", str(extension)], check=True, capture_output=True,
                          text=True, env=dict(os.environ, LC_ALL="C")).stdout
    found = [line.split("[", 1)[1].rsplit("]", 1)[0] for line in text.splitlines()
             if "(RUNPATH)" in line or "(RPATH)" in line]
    return ";".join(found)


def check_run_path(wheel: Path) -> None:
    """SystemExit unless the wheel's extension finds librdkafka beside it, and only there."""
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        (name,) = [n for n in zf.namelist()
                   if n.startswith("confluent_kafka/cimpl.") and n.endswith(".so")]
        found = run_path(Path(zf.extract(name, tmp)))
    if found != RUN_PATH:
        raise SystemExit(f"build_kafka_client: {name} has the run path {found!r}, expected "
                         f"{RUN_PATH!r}: nothing installed")


def check_features(library: Path) -> None:
    """SystemExit unless the built library reports every one of ``FEATURES``."""
    lib = ctypes.CDLL(str(library))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_get.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.POINTER(ctypes.c_size_t))
    lib.rd_kafka_conf_destroy.argtypes = (ctypes.c_void_p,)
    conf = lib.rd_kafka_conf_new()
    size = ctypes.c_size_t(1024)
    text = ctypes.create_string_buffer(size.value)
    lib.rd_kafka_conf_get(conf, b"builtin.features", text, ctypes.byref(size))
    lib.rd_kafka_conf_destroy(conf)
    features = set(text.value.decode().split(","))
    missing = [f for f in FEATURES if f not in features]
    if missing:
        raise SystemExit(f"build_kafka_client: the librdkafka built lacks {missing} (it has "
                         f"{sorted(features)}): are the development files of Cyrus SASL, "
                         f"libcurl, OpenSSL and zstd installed?")


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def bundle(wheel: Path, library: Path, out: Path) -> Path:
    """A copy of ``wheel`` holding ``library`` as ``confluent_kafka.libs/librdkafka.so.1``,
    its RECORD rewritten to list it."""
    target = out / wheel.name
    rows: list[list[str]] = []
    with zipfile.ZipFile(wheel) as src, \
            zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if info.filename == record_name:
                continue
            data = src.read(info)
            dst.writestr(info, data)
            rows.append(_record_line(info.filename, data))
        data = library.read_bytes()
        info = zipfile.ZipInfo(f"{LIBS_DIR}/{LIBRARY}", date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = 0o100755 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        dst.writestr(info, data)
        rows.append(_record_line(info.filename, data))
        rows.append([record_name, "", ""])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        dst.writestr(record_name, text.getvalue())
    return target


def recipe() -> str:
    """What the wheel is built from: this file (its pins and steps) and the interpreter."""
    text = Path(__file__).read_bytes() + sys.version.encode()
    return hashlib.sha256(text).hexdigest()


def main(out: Path) -> Path:
    """The wheel in ``out``, built unless one of the same recipe is there already."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "recipe"
    wheels = sorted(out.glob("confluent_kafka-*.whl"))
    if len(wheels) == 1 and stamp.is_file() and stamp.read_text() == recipe():
        return wheels[0]
    stamp.unlink(missing_ok=True)
    for old in wheels:
        old.unlink()
    tree = extract(source_archive(), out / "src")
    library = build_library(tree, out / "prefix")
    check_features(library)
    built = build_client(out / "prefix", out)
    check_run_path(built)
    wheel = bundle(built, library, out)
    shutil.rmtree(out / "sdist-build", ignore_errors=True)
    shutil.rmtree(out / "src", ignore_errors=True)
    stamp.write_text(recipe())
    return wheel


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(f"confluent-kafka on librdkafka {LIBRDKAFKA_VERSION}: {main(Path(sys.argv[1]))}")
