"""A Kerberos realm on 127.0.0.1 for the GSSAPI tests: Debian's MIT KDC (``krb5kdc``, package
``krb5-kdc``) started by the test with a database, a configuration and a port of its own, and
``kadmin.local`` (``krb5-admin-server``) making the principals and their keytabs.

The brokers' service principal is ``kafka/localhost``: both kinds of client name the broker
they reach at 127.0.0.1 by the reverse lookup of that address (``/etc/hosts``: ``localhost``) —
the Java client itself, librdkafka through MIT's canonicalisation of host-based service names
(``dns_canonicalize_hostname`` and ``rdns``, left at their defaults). A broker at ``127.0.0.1``
with a principal for ``127.0.0.1`` would be reached by neither; Kafka 4.1's broker takes one
principal per listener (a wildcard one fails its first login). Each client principal is a
role's name (``agent@DOCKET.TEST``), which Kafka's default mapping rule turns into
``User:agent``: the ACLs of ``broker/security.py`` apply unchanged. Clients find the realm
through ``KRB5_CONFIG`` (librdkafka's ``kinit`` and Cyrus SASL's GSSAPI module) or
``-Djava.security.krb5.conf`` (the JVMs); the KDC speaks TCP only (``udp_preference_limit =
1``), on one port.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

REALM = "DOCKET.TEST"
SERVICE = "kafka"
HOST = "127.0.0.1"
SERVICE_HOST = "localhost"
KRB5_LOGIN = "com.sun.security.auth.module.Krb5LoginModule"
KDC = "/usr/sbin/krb5kdc"
KADMIN = "/usr/sbin/kadmin.local"
KDB5_UTIL = "/usr/sbin/kdb5_util"


def available() -> str | None:
    """None if a realm can be started here, else what is missing."""
    for tool, package in ((KDC, "krb5-kdc"), (KADMIN, "krb5-admin-server"),
                          (KDB5_UTIL, "krb5-kdc"), ("kinit", "krb5-user")):
        if not (Path(tool).is_file() if tool.startswith("/") else shutil.which(tool)):
            return f"{tool} is missing (Debian's {package}; make setup installs it as root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Realm:
    """Start with ``start()``, stop with ``stop()``; ``keytab(name)`` is a principal's keytab."""

    def __init__(self, folder: Path, principals: tuple[str, ...]):
        self.folder, self.principals = folder, tuple(principals)
        self.krb5_conf = folder / "krb5.conf"
        self.kdc_conf = folder / "kdc.conf"
        self.log = folder / "kdc.log"
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def service_principal(self) -> str:
        return f"{SERVICE}/{SERVICE_HOST}@{REALM}"

    @property
    def service_keytab(self) -> Path:
        return self.folder / f"{SERVICE}.keytab"

    def principal(self, name: str) -> str:
        return f"{name}@{REALM}"

    def keytab(self, name: str) -> Path:
        return self.folder / f"{name.replace('/', '_')}.keytab"

    def env(self) -> dict[str, str]:
        """What a process reaching this realm needs in its environment."""
        return {"KRB5_CONFIG": str(self.krb5_conf), "KRB5_KDC_PROFILE": str(self.kdc_conf)}

    def java_options(self) -> list[str]:
        return [f"-Djava.security.krb5.conf={self.krb5_conf}"]

    # -- the realm ----------------------------------------------------------------------------
    def _write_conf(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.kdc_conf.write_text(
            "[kdcdefaults]\n"
            f"    kdc_listen = {HOST}:{self.port}\n"
            f"    kdc_tcp_listen = {HOST}:{self.port}\n"
            "[realms]\n"
            f"    {REALM} = {{\n"
            f"        database_name = {self.folder / 'principal'}\n"
            f"        key_stash_file = {self.folder / 'stash'}\n"
            f"        acl_file = {self.folder / 'kadm5.acl'}\n"
            "        max_life = 10h 0m 0s\n"
            "        supported_enctypes = aes256-cts-hmac-sha1-96:normal "
            "aes128-cts-hmac-sha1-96:normal\n"
            "    }\n"
            "[logging]\n"
            f"    kdc = FILE:{self.log}\n")
        self.krb5_conf.write_text(
            "[libdefaults]\n"
            f"    default_realm = {REALM}\n"
            "    dns_lookup_realm = false\n"
            "    dns_lookup_kdc = false\n"
            "    udp_preference_limit = 1\n"
            "    ticket_lifetime = 10h\n"
            "[realms]\n"
            f"    {REALM} = {{\n"
            f"        kdc = {HOST}:{self.port}\n"
            "    }\n"
            "[domain_realm]\n"
            f"    {HOST} = {REALM}\n")
        (self.folder / "kadm5.acl").write_text("")

    def _run(self, *cmd: str) -> str:
        out = subprocess.run(cmd, env={**os.environ, **self.env()}, capture_output=True,
                             text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {out.returncode}\n{out.stdout}{out.stderr}")
        return out.stdout

    def kadmin(self, query: str) -> str:
        return self._run(KADMIN, "-r", REALM, "-q", query)

    def add(self, name: str) -> Path:
        """A principal with a random key, exported to its keytab (mode 0600). It must prove
        its key before the KDC answers (pre-authentication), so a wrong key is a refusal in
        the KDC's log, not a ticket the client cannot read."""
        keytab = self.keytab(name)
        keytab.unlink(missing_ok=True)
        self.kadmin(f"addprinc -randkey +requires_preauth {name}")
        self.kadmin(f"ktadd -k {keytab} {name}")
        keytab.chmod(0o600)
        return keytab

    def change_key(self, name: str) -> None:
        """A new random key for ``name``, its keytab left as it was: that keytab is now
        wrong (what a client of a rotated principal holds)."""
        self.kadmin(f"cpw -randkey {name}")

    def start(self, timeout_s: float = 30) -> Realm:
        self.port = _free_port()
        self._write_conf()
        self._run(KDB5_UTIL, "-r", REALM, "create", "-s", "-P", secrets.token_urlsafe(18))
        self.kadmin(f"addprinc -randkey {SERVICE}/{SERVICE_HOST}")
        self.kadmin(f"ktadd -k {self.service_keytab} {SERVICE}/{SERVICE_HOST}")
        for name in self.principals:
            self.add(name)
        return self.serve(timeout_s)

    def serve(self, timeout_s: float = 30) -> Realm:
        """Start the KDC on the realm's port (again, after ``stop``: the same database)."""
        self._proc = subprocess.Popen([KDC, "-n", "-r", REALM],
                                      env={**os.environ, **self.env()},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"krb5kdc exited {self._proc.returncode}: "
                                   f"{self.log.read_text() if self.log.exists() else ''}")
            try:
                socket.create_connection((HOST, self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"krb5kdc did not listen on {HOST}:{self.port} in {timeout_s} s")

    def serving(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def requests(self, name: str) -> int:
        """How many initial tickets (AS requests) the KDC issued to ``name`` so far."""
        if not self.log.exists():
            return 0
        return sum(1 for line in self.log.read_text().splitlines()
                   if "AS_REQ" in line and "ISSUE" in line and f" {self.principal(name)} " in
                   line)

    def refusals(self, name: str) -> int:
        """How many of ``name``'s AS requests the KDC refused for a wrong key."""
        if not self.log.exists():
            return 0
        return sum(1 for line in self.log.read_text().splitlines()
                   if "AS_REQ" in line and "PREAUTH_FAILED" in line and
                   f" {self.principal(name)} " in line)

    # -- the brokers --------------------------------------------------------------------------
    def broker_props(self, listener: str = "sasl_ssl") -> dict[str, str]:
        """``server.properties`` beside a SCRAM listener's: GSSAPI enabled on it too, the
        brokers logging in with the service principal's keytab."""
        return {
            "sasl.kerberos.service.name": SERVICE,
            f"listener.name.{listener}.gssapi.sasl.jaas.config":
                f'{KRB5_LOGIN} required useKeyTab=true storeKey=true '
                f'keyTab="{self.service_keytab}" principal="{self.service_principal}";',
        }
