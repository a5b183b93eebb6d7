"""How every Kafka client of docket authenticates: the settings declared once, read from files.

The agent (``[broker]``), the reconciler (``[reconcile]``) and the Spark jobs and the mirror's
watcher (a ``--kafka-config FILE`` with a ``[kafka]`` table) all take the same keys:

    security_protocol     plaintext | ssl | sasl_ssl
    sasl_mechanism        SCRAM-SHA-512 (default) | SCRAM-SHA-256 | PLAIN | OAUTHBEARER | GSSAPI
    sasl_username         (SCRAM, PLAIN)
    sasl_password_file    the password, in a file only its owner can read (SCRAM, PLAIN)
    sasl_oauthbearer_token_endpoint_url   OAUTHBEARER: the identity provider's token endpoint
    sasl_oauthbearer_client_id            OAUTHBEARER: the client credentials' id ...
    sasl_oauthbearer_client_secret_file   ... and its secret, in a file only its owner can read
    sasl_oauthbearer_scope                OAUTHBEARER: the scope asked for (optional)
    sasl_oauthbearer_ca_file              OAUTHBEARER: PEM: the CA of the token endpoint's
                                          certificate (default: the system's CAs)
    sasl_kerberos_principal     GSSAPI (Kerberos): this client's principal ...
    sasl_kerberos_keytab_file   ... and its keytab, a file only its owner can read
    sasl_kerberos_service_name  GSSAPI: the brokers' service principal's first part (kafka)
    ssl_ca_file           PEM: the CA that signed the brokers' certificates
    ssl_certificate_file  PEM: the client's certificate (mutual TLS)
    ssl_key_file          PEM: the client's private key
    ssl_key_password_file the key's password, if it has one

A password is never a setting, an argument or a log line: it is read from its file when a
client is made (so a file changed and the process reloaded takes effect). A file path may start
with ``${CREDENTIALS_DIRECTORY}/``, where systemd's ``LoadCredential=`` puts a service's
credentials. OAUTHBEARER is OpenID Connect's client-credentials grant: every client asks the
token endpoint for a token with its id and secret and logs in with it, again before it expires
(librdkafka's ``sasl.oauthbearer.method = oidc``; the Java client's login callback handler).
GSSAPI is Kerberos with a keytab: librdkafka runs MIT's ``kinit`` with it for the process's
ticket cache and again before the ticket ends, the Java client logs in with it through JAAS'
``Krb5LoginModule``; the realm comes from the host's ``krb5.conf`` (or ``KRB5_CONFIG``, and
``-Djava.security.krb5.conf`` for a JVM).
``check`` says, before anything connects, what is wrong with the files: missing,
unreadable, a password file others can read, a key without a certificate.

``librdkafka_properties`` turns the settings into confluent-kafka's properties,
``spark_options`` into Spark's Kafka source and sink options (``kafka.`` prefix, a JAAS line
built from the password file: never on a command line, where ``ps`` would show it), and
``redact`` keeps every secret out of what is printed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .settings import ConfigError, Setting, is_loopback, load_toml, parse_sections

PROTOCOLS = ("plaintext", "ssl", "sasl_ssl")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER", "GSSAPI")
OAUTHBEARER = "OAUTHBEARER"
GSSAPI = "GSSAPI"
_JAVA_KRB5_MODULE = "com.sun.security.auth.module.Krb5LoginModule"
# librdkafka puts the principal and the keytab's path into the kinit command it runs through
# the shell (the path between double quotes): a principal of other characters, or starting
# with "-" (an option of kinit's), and a path holding one of _PATH_UNSAFE are refused.
_SERVICE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_PRINCIPAL_CHARS = _SERVICE_CHARS | frozenset("/@")
_PATH_UNSAFE = frozenset('"$`\\\n')
# The Java client's OIDC login: the token fetched from the endpoint with the client credentials.
_JAVA_OIDC_LOGIN = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
_JAVA_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
# The system property naming the token endpoints a Java client of Kafka 4 may ask (the 3.9
# client Spark runs asks any).
ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
# The system's CA bundle, where each family keeps it (Debian and Ubuntu; Red Hat; SUSE).
SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                     "/etc/ssl/ca-bundle.pem")
CREDENTIALS = "${CREDENTIALS_DIRECTORY}"


def settings(section: str) -> tuple[Setting, ...]:
    """The security settings, declared under ``section`` (``broker``, ``reconcile``, ``kafka``)."""
    return (
        Setting(f"{section}.security_protocol", str, "plaintext", "How to reach the brokers: "
                "`plaintext`, `ssl` (TLS; with a client certificate for mutual TLS) or "
                "`sasl_ssl` (TLS and a SASL login: a user and password, OAUTHBEARER tokens or "
                "Kerberos).",
                choices=PROTOCOLS),
        Setting(f"{section}.sasl_mechanism", str, "SCRAM-SHA-512", "The SASL mechanism "
                "(`sasl_ssl`).", choices=MECHANISMS),
        Setting(f"{section}.sasl_username", str, None, "The SASL user (`sasl_ssl` with SCRAM or "
                "PLAIN)."),
        Setting(f"{section}.sasl_password_file", str, None, "File holding the SASL user's "
                "password (its first line), readable by its owner only. May start with "
                "`${CREDENTIALS_DIRECTORY}/` (systemd `LoadCredential=`)."),
        Setting(f"{section}.sasl_oauthbearer_token_endpoint_url", str, None, "OAUTHBEARER: "
                "the OpenID Connect token endpoint this client asks for its tokens (client "
                "credentials grant), e.g. `https://idp.example.com/oauth2/token` (plain http "
                "only on this host)."),
        Setting(f"{section}.sasl_oauthbearer_client_id", str, None, "OAUTHBEARER: the client "
                "id of this client's credentials."),
        Setting(f"{section}.sasl_oauthbearer_client_secret_file", str, None, "OAUTHBEARER: "
                "file holding the client secret (its first line), readable by its owner only; "
                "may start with `${CREDENTIALS_DIRECTORY}/`."),
        Setting(f"{section}.sasl_oauthbearer_scope", str, None, "OAUTHBEARER: the scope "
                "asked for (space-separated), where the identity provider needs one."),
        Setting(f"{section}.sasl_oauthbearer_ca_file", str, None, "OAUTHBEARER: PEM file of "
                "the CA that signed the token endpoint's certificate (an `https` endpoint). "
                "Default: the system's CAs."),
        Setting(f"{section}.sasl_kerberos_principal", str, None, "GSSAPI (Kerberos): this "
                "client's principal, e.g. `docket-agent/host.example.com@EXAMPLE.COM`."),
        Setting(f"{section}.sasl_kerberos_keytab_file", str, None, "GSSAPI: the keytab "
                "holding that principal's key, readable by its owner only; may start with "
                "`${CREDENTIALS_DIRECTORY}/`."),
        Setting(f"{section}.sasl_kerberos_service_name", str, "kafka", "GSSAPI: the first "
                "part of the brokers' service principal (`kafka/BROKER-HOST@REALM`)."),
        Setting(f"{section}.ssl_ca_file", str, None, "PEM file of the CA that signed the "
                "brokers' certificates (`ssl`, `sasl_ssl`). Default: the system's CAs."),
        Setting(f"{section}.ssl_certificate_file", str, None, "PEM file of this client's "
                "certificate (mutual TLS)."),
        Setting(f"{section}.ssl_key_file", str, None, "PEM file of this client's private key "
                "(mutual TLS), readable by its owner only."),
        Setting(f"{section}.ssl_key_password_file", str, None, "File holding the private key's "
                "password, if it has one."),
    )


@dataclass(frozen=True)
class KafkaSecurity:
    """One client's security settings, as declared by ``settings``; ``section`` names where
    they came from, for the errors."""
    section: str
    protocol: str = "plaintext"
    mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password_file: str | None = None
    ca_file: str | None = None
    certificate_file: str | None = None
    key_file: str | None = None
    key_password_file: str | None = None
    token_endpoint_url: str | None = None
    client_id: str | None = None
    client_secret_file: str | None = None
    scope: str | None = None
    oauth_ca_file: str | None = None
    kerberos_principal: str | None = None
    keytab_file: str | None = None
    service_name: str = "kafka"

    @classmethod
    def from_values(cls, values: dict, section: str) -> KafkaSecurity:
        def v(key):
            return values.get(f"{section}.{key}")
        return cls(section, v("security_protocol") or "plaintext",
                   v("sasl_mechanism") or "SCRAM-SHA-512", v("sasl_username"),
                   v("sasl_password_file"), v("ssl_ca_file"), v("ssl_certificate_file"),
                   v("ssl_key_file"), v("ssl_key_password_file"),
                   v("sasl_oauthbearer_token_endpoint_url"), v("sasl_oauthbearer_client_id"),
                   v("sasl_oauthbearer_client_secret_file"), v("sasl_oauthbearer_scope"),
                   v("sasl_oauthbearer_ca_file"), v("sasl_kerberos_principal"),
                   v("sasl_kerberos_keytab_file"), v("sasl_kerberos_service_name") or "kafka")

    @property
    def oauth(self) -> bool:
        return self.protocol == "sasl_ssl" and self.mechanism == OAUTHBEARER

    @property
    def kerberos(self) -> bool:
        return self.protocol == "sasl_ssl" and self.mechanism == GSSAPI

    @property
    def secured(self) -> bool:
        return self.protocol != "plaintext"

    def check(self) -> None:
        """Raise ConfigError for the first thing that would keep this client from connecting
        that can be seen without connecting: the settings' form, then their files."""
        self.check_form()
        self.check_files()

    def check_form(self) -> None:
        """The settings fit together (a SASL user with its password file, a certificate with
        its key, nothing of TLS on a plaintext connection). Reads no file."""
        s = self.section
        oauth = (("sasl_oauthbearer_token_endpoint_url", self.token_endpoint_url,
                  "the identity provider's token endpoint (https://…)"),
                 ("sasl_oauthbearer_client_id", self.client_id, "this client's id"),
                 ("sasl_oauthbearer_client_secret_file", self.client_secret_file,
                  "a file holding the client secret, mode 0600"),
                 ("sasl_oauthbearer_scope", self.scope, ""),
                 ("sasl_oauthbearer_ca_file", self.oauth_ca_file, ""))
        if self.oauth:
            for key, value, hint in oauth[:3]:
                if not value:
                    raise ConfigError(f"{s}.{key}", "missing (sasl_mechanism = "
                                      "\"OAUTHBEARER\")", hint=hint)
            _check_endpoint(f"{s}.sasl_oauthbearer_token_endpoint_url",
                            self.token_endpoint_url)
            for key, value in (("sasl_username", self.username),
                               ("sasl_password_file", self.password_file)):
                if value:
                    raise ConfigError(f"{s}.{key}", "set, but sasl_mechanism is "
                                      "\"OAUTHBEARER\"", hint="an OAUTHBEARER client logs in "
                                      "with sasl_oauthbearer_client_id and its secret file")
        else:
            for key, value, _hint in oauth:
                if value and self.mechanism == OAUTHBEARER:
                    raise ConfigError(f"{s}.{key}", f"set, but security_protocol is "
                                      f"{self.protocol!r}", hint="OAUTHBEARER logs in over "
                                      "security_protocol = \"sasl_ssl\"")
                if value:
                    raise ConfigError(f"{s}.{key}", "set, but sasl_mechanism is not "
                                      "\"OAUTHBEARER\"", hint="use security_protocol = "
                                      "\"sasl_ssl\" with sasl_mechanism = \"OAUTHBEARER\", "
                                      "or remove it")
        self._check_kerberos_form()
        if self.protocol == "sasl_ssl" and not self.oauth and not self.kerberos:
            if not self.username:
                raise ConfigError(f"{s}.sasl_username", "missing (security_protocol = "
                                  "\"sasl_ssl\")", hint="the SASL user this client logs in as")
            if not self.password_file:
                raise ConfigError(f"{s}.sasl_password_file", "missing (security_protocol = "
                                  "\"sasl_ssl\")", hint="a file holding the password, mode 0600")
        if self.protocol != "sasl_ssl":
            for key, value in (("sasl_username", self.username),
                               ("sasl_password_file", self.password_file)):
                if value:
                    raise ConfigError(f"{s}.{key}", f"set, but security_protocol is "
                                      f"{self.protocol!r}", hint="use security_protocol = "
                                      "\"sasl_ssl\", or remove it")
        if not self.secured:
            for key, value in (("ssl_ca_file", self.ca_file),
                               ("ssl_certificate_file", self.certificate_file),
                               ("ssl_key_file", self.key_file)):
                if value:
                    raise ConfigError(f"{s}.{key}", "set, but security_protocol is "
                                      "\"plaintext\"", hint="use \"ssl\" or \"sasl_ssl\", "
                                      "or remove it")
        if bool(self.certificate_file) != bool(self.key_file):
            missing = "ssl_key_file" if self.certificate_file else "ssl_certificate_file"
            raise ConfigError(f"{s}.{missing}", "missing: a client certificate needs its key "
                              "and the key its certificate")

    def _check_kerberos_form(self) -> None:
        s = self.section
        keys = (("sasl_kerberos_principal", self.kerberos_principal,
                 "this client's principal, e.g. docket-agent/host.example.com@EXAMPLE.COM"),
                ("sasl_kerberos_keytab_file", self.keytab_file,
                 "the keytab holding its key, mode 0600"))
        if not self.kerberos:
            for key, value, _hint in (*keys, ("sasl_kerberos_service_name",
                                              self.service_name != "kafka", "")):
                if value:
                    raise ConfigError(f"{s}.{key}", "set, but security_protocol and "
                                      "sasl_mechanism are not \"sasl_ssl\" and \"GSSAPI\"",
                                      hint="use them for Kerberos, or remove it")
            return
        for key, value, hint in keys:
            if not value:
                raise ConfigError(f"{s}.{key}", "missing (sasl_mechanism = \"GSSAPI\")",
                                  hint=hint)
        for key, value in (("sasl_username", self.username),
                           ("sasl_password_file", self.password_file)):
            if value:
                raise ConfigError(f"{s}.{key}", "set, but sasl_mechanism is \"GSSAPI\"",
                                  hint="a Kerberos client logs in with "
                                  "sasl_kerberos_principal and its keytab")
        if not set(self.kerberos_principal) <= _PRINCIPAL_CHARS or \
                self.kerberos_principal.startswith("-"):
            raise ConfigError(f"{s}.sasl_kerberos_principal", f"{self.kerberos_principal!r} "
                              "holds a character a principal does not, or starts with -",
                              hint="letters, digits and . _ - / @ only")
        if not self.service_name or not set(self.service_name) <= _SERVICE_CHARS:
            raise ConfigError(f"{s}.sasl_kerberos_service_name", f"{self.service_name!r} is "
                              "not a service name (the first part of the brokers' principal)",
                              hint="letters, digits and . _ - only, e.g. kafka")
        _check_keytab_path(f"{s}.sasl_kerberos_keytab_file",
                           self.keytab_file.removeprefix(CREDENTIALS))

    def check_files(self) -> None:
        """Each file named exists and is readable by this process; a secret (password, key) is
        not readable by every user."""
        s = self.section
        for key, value, secret in (("sasl_password_file", self.password_file, True),
                                   ("sasl_oauthbearer_client_secret_file",
                                    self.client_secret_file, True),
                                   ("sasl_oauthbearer_ca_file", self.oauth_ca_file, False),
                                   ("ssl_ca_file", self.ca_file, False),
                                   ("ssl_certificate_file", self.certificate_file, False),
                                   ("ssl_key_file", self.key_file, True),
                                   ("ssl_key_password_file", self.key_password_file, True),
                                   ("sasl_kerberos_keytab_file", self.keytab_file, True)):
            if value:
                _check_file(f"{s}.{key}", value, secret)

    def librdkafka_properties(self) -> dict[str, str]:
        """confluent-kafka's properties for these settings (reads the password files)."""
        if not self.secured:
            return {}
        conf = {"security.protocol": self.protocol.upper()}
        if self.oauth:
            conf.update({"sasl.mechanism": OAUTHBEARER, "sasl.oauthbearer.method": "oidc",
                         "sasl.oauthbearer.token.endpoint.url": self.token_endpoint_url,
                         "sasl.oauthbearer.client.id": self.client_id,
                         "sasl.oauthbearer.client.secret": self._client_secret()})
            if self.scope:
                conf["sasl.oauthbearer.scope"] = self.scope
            ca = self._endpoint_ca()
            if ca:
                conf["https.ca.location"] = ca
        elif self.kerberos:
            self._check_kerberos_client()
            keytab = resolve(self.keytab_file)
            _check_keytab_path(f"{self.section}.sasl_kerberos_keytab_file", keytab)
            own_ticket_cache(self.kerberos_principal)
            conf.update({"sasl.mechanism": GSSAPI,
                         "sasl.kerberos.service.name": self.service_name,
                         "sasl.kerberos.principal": self.kerberos_principal,
                         "sasl.kerberos.keytab": keytab})
        elif self.protocol == "sasl_ssl":
            conf.update({"sasl.mechanism": self.mechanism, "sasl.username": self.username,
                         "sasl.password": read_secret(f"{self.section}.sasl_password_file",
                                                      self.password_file)})
        if self.ca_file:
            conf["ssl.ca.location"] = resolve(self.ca_file)
        if self.certificate_file:
            conf["ssl.certificate.location"] = resolve(self.certificate_file)
            conf["ssl.key.location"] = resolve(self.key_file)
        if self.key_password_file:
            conf["ssl.key.password"] = read_secret(f"{self.section}.ssl_key_password_file",
                                                   self.key_password_file)
        return conf

    def java_properties(self, secret: Callable[[str, str], str] | None = None
                        ) -> dict[str, str]:
        """The Java client's properties (MirrorMaker 2's, and Spark's under ``kafka.``): PEM
        files, and for SASL a JAAS line with the password read from its file. ``secret(name,
        value)`` says what to write for each secret value (``password``, ``key``,
        ``certificate``, ``key-password``): by default the value itself (Spark's options, held
        in memory); MirrorMaker 2 writes a reference to a file instead, since it stores its
        connectors' settings in a Kafka topic."""
        if not self.secured:
            return {}
        put = secret or (lambda _name, value: value)
        props = {"security.protocol": self.protocol.upper()}
        if self.oauth:
            scope = f' scope="{_jaas(self.scope)}"' if self.scope else ""
            if self.oauth_ca_file:           # the endpoint's trust: SSL options of the JAAS line
                scope += (f' ssl.truststore.type="PEM" ssl.truststore.location='
                          f'"{_jaas(resolve(self.oauth_ca_file))}"')
            props.update({
                "sasl.mechanism": OAUTHBEARER,
                "sasl.login.callback.handler.class": _JAVA_OIDC_LOGIN,
                "sasl.oauthbearer.token.endpoint.url": self.token_endpoint_url,
                "sasl.jaas.config": f'{_JAVA_OAUTH_MODULE} required clientId='
                                    f'"{_jaas(self.client_id)}" clientSecret='
                                    f'"{put("password", _jaas(self._client_secret()))}"'
                                    f'{scope};'})
        elif self.kerberos:
            props.update({
                "sasl.mechanism": GSSAPI,
                "sasl.kerberos.service.name": self.service_name,
                "sasl.jaas.config": f'{_JAVA_KRB5_MODULE} required useKeyTab=true '
                                    f'storeKey=true doNotPrompt=true keyTab='
                                    f'"{_jaas(resolve(self.keytab_file))}" principal='
                                    f'"{_jaas(self.kerberos_principal)}";'})
        elif self.protocol == "sasl_ssl":
            password = read_secret(f"{self.section}.sasl_password_file", self.password_file)
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule"
                      if self.mechanism == "PLAIN" else
                      "org.apache.kafka.common.security.scram.ScramLoginModule")
            props["sasl.mechanism"] = self.mechanism
            props["sasl.jaas.config"] = (f'{module} required username="{_jaas(self.username)}"'
                                         f' password="{put("password", _jaas(password))}";')
        if self.ca_file:
            props["ssl.truststore.type"] = "PEM"
            props["ssl.truststore.location"] = resolve(self.ca_file)
        if self.certificate_file:
            # The Java client takes a PEM key store as one file: the key, then the chain.
            props["ssl.keystore.type"] = "PEM"
            props["ssl.keystore.certificate.chain"] = put("certificate", Path(
                resolve(self.certificate_file)).read_text())
            props["ssl.keystore.key"] = put("key", Path(resolve(self.key_file)).read_text())
            if self.key_password_file:
                props["ssl.key.password"] = put("key-password", read_secret(
                    f"{self.section}.ssl_key_password_file", self.key_password_file))
        return props

    def _check_kerberos_client(self) -> None:
        """ConfigError unless this process's librdkafka can log in with Kerberos: built with
        Cyrus SASL's GSSAPI, and MIT's ``kinit`` (which it runs for the ticket) on the PATH."""
        import shutil

        refused = gssapi_refused()
        if refused:
            raise ConfigError(f"{self.section}.sasl_mechanism", f"\"GSSAPI\", but this "
                              f"process's librdkafka cannot: {refused}",
                              hint="install docket's own build (make setup builds "
                              "librdkafka with Kerberos: packaging/build_kafka_client.py)")
        if shutil.which("kinit") is None:
            raise ConfigError(f"{self.section}.sasl_mechanism", "\"GSSAPI\", but MIT's kinit "
                              "is not on the PATH: librdkafka runs it for the ticket",
                              hint="install Debian's krb5-user")
        if not any(any(Path(d).glob("libgssapiv2.so*")) for d in SASL_PLUGIN_DIRS):
            raise ConfigError(f"{self.section}.sasl_mechanism", "\"GSSAPI\", but Cyrus SASL's "
                              f"GSSAPI module is in none of {', '.join(SASL_PLUGIN_DIRS)}: "
                              "every login would fail (\"No worthy mechs found\")",
                              hint="install Debian's libsasl2-modules-gssapi-mit")

    def _endpoint_ca(self) -> str | None:
        """librdkafka's CA file for the token endpoint: the one set, else for an ``https``
        endpoint the system's bundle (a librdkafka built for another distribution looks for
        its file: PyPI's confluent-kafka build looked for Red Hat's, which Debian has not)."""
        if self.oauth_ca_file:
            return resolve(self.oauth_ca_file)
        if not self.token_endpoint_url.startswith("https://"):
            return None
        return next((p for p in SYSTEM_CA_BUNDLES if os.path.isfile(p)), None)

    def _client_secret(self) -> str:
        return read_secret(f"{self.section}.sasl_oauthbearer_client_secret_file",
                           self.client_secret_file)

    def spark_options(self) -> dict[str, str]:
        """Spark's Kafka source and sink options: ``java_properties`` under ``kafka.``."""
        return {f"kafka.{k}": v for k, v in self.java_properties().items()}

    def table(self) -> dict[str, str]:
        """The settings that are set, by their keys within the section: what a ``[kafka]``
        table of ``--kafka-config`` holds (files, never a secret)."""
        keys = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password_file",
                "ssl_ca_file", "ssl_certificate_file", "ssl_key_file", "ssl_key_password_file",
                "sasl_oauthbearer_token_endpoint_url", "sasl_oauthbearer_client_id",
                "sasl_oauthbearer_client_secret_file", "sasl_oauthbearer_scope",
                "sasl_oauthbearer_ca_file", "sasl_kerberos_principal", "sasl_kerberos_keytab_file",
                "sasl_kerberos_service_name")
        values = (self.protocol, self.mechanism if self.protocol == "sasl_ssl" else None,
                  self.username, self.password_file, self.ca_file, self.certificate_file,
                  self.key_file, self.key_password_file, self.token_endpoint_url,
                  self.client_id, self.client_secret_file, self.scope, self.oauth_ca_file,
                  self.kerberos_principal, self.keytab_file,
                  self.service_name if self.kerberos and self.service_name != "kafka" else None)
        return {k: v for k, v in zip(keys, values, strict=True) if v}

    @classmethod
    def from_table(cls, table: dict, section: str = "kafka") -> KafkaSecurity:
        """From one table's keys (``table``'s inverse), checked for form."""
        unknown = sorted(set(table) - {s.key[len(section) + 1:] for s in settings(section)})
        if unknown:
            raise ConfigError(f"{section}.{unknown[0]}", "not a security setting",
                              hint="the keys are in docs/security.md")
        security = cls.from_values({f"{section}.{k}": v for k, v in table.items()}, section)
        security.check_form()
        return security

    def describe(self) -> str:
        """What status and logs may show: the protocol, the user, the files — no secret."""
        if not self.secured:
            return "plaintext"
        parts = [self.protocol]
        if self.oauth:
            parts.append(f"OAUTHBEARER client {self.client_id} from {self.token_endpoint_url}")
        elif self.kerberos:
            parts.append(f"GSSAPI principal {self.kerberos_principal}")
        elif self.protocol == "sasl_ssl":
            parts.append(f"{self.mechanism} user {self.username}")
        if self.certificate_file:
            parts.append(f"client certificate {self.certificate_file}")
        return ", ".join(parts)


_CACHE_FOLDER = "docket-krb5-"
# Where Cyrus SASL looks for its modules (Debian's multiarch folders; others').
SASL_PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/sasl2", "/usr/lib/aarch64-linux-gnu/sasl2",
                    "/usr/lib64/sasl2", "/usr/lib/sasl2")


def _check_keytab_path(key: str, path: str) -> None:
    if set(path) & _PATH_UNSAFE:
        raise ConfigError(key, "holds a quote, $, ` or \\ (beside ${CREDENTIALS_DIRECTORY}/ "
                          "at its start)", hint="librdkafka passes the path to kinit through "
                          "the shell: name a path without them")


def check_one_principal(securities, what: str) -> None:
    """ConfigError if ``securities`` (the clients of one process: the mirror's two sides) log
    in with two Kerberos principals: librdkafka's login uses the process's one ticket cache,
    each kinit replacing the other's ticket."""
    principals = {s.kerberos_principal: s for s in securities if s is not None and s.kerberos}
    if len(principals) > 1:
        first, second = list(principals.values())[:2]
        raise ConfigError(f"{second.section}.sasl_kerberos_principal", f"{what} logs in as "
                          f"{first.kerberos_principal} and {second.kerberos_principal}: one "
                          "process holds one Kerberos principal (one ticket cache)",
                          hint="give both the same principal (a realm trusted by both "
                          "clusters), or another sign-in for one of them")


def own_ticket_cache(principal: str) -> str:
    """Point this process's Kerberos ticket cache (``KRB5CCNAME``) at one of ``principal``'s
    own, unless its user named one; returns the cache in use.

    librdkafka's GSSAPI login uses the process's default cache, which its ``kinit`` fills:
    two docket processes of one system user with different principals (the mirror's watcher
    and the reconciler on an audit host) would each overwrite the other's ticket in
    ``/tmp/krb5cc_UID``. Each principal gets ``FILE:$TMPDIR/docket-krb5-UID/PRINCIPAL-HASH``
    instead, in a folder only this user may enter. A process holds one principal (one role),
    and a child inherits the value: a cache docket chose is replaced, one a user set is kept."""
    current = os.environ.get("KRB5CCNAME")
    if current and _CACHE_FOLDER not in current:
        return current
    folder = Path(tempfile.gettempdir()) / f"{_CACHE_FOLDER}{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
    except OSError as exc:
        raise ConfigError("KRB5CCNAME", f"cannot make the Kerberos ticket cache's folder "
                          f"{folder}: {exc.strerror}", hint="name a cache of this user's in "
                          "KRB5CCNAME") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError("KRB5CCNAME", f"{folder} is not a folder of this user's alone",
                          hint="remove it, or name a cache of this user's in KRB5CCNAME")
    # Readable, and one file per principal: "a/b@R" and "a_b@R" apart, ".." a name like others.
    digest = hashlib.sha256(principal.encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in principal)
    value = f"FILE:{folder / f'{name}-{digest}'}"
    if current != value:                 # (librdkafka's threads read it: set only a change)
        os.environ["KRB5CCNAME"] = value
    return value


def without_kinit(conf: dict) -> dict:
    """librdkafka settings ``conf`` for a client that runs no ``kinit`` (GSSAPI): with its
    ticket refresh off, it logs in with what the ticket cache holds, asking no KDC."""
    return {**conf, "sasl.kerberos.min.time.before.relogin": 0}


@functools.cache
def gssapi_refused() -> str | None:
    """None if this process's librdkafka takes GSSAPI, else its own words why not (a client
    asking for it is refused when it is made; this one never connects, nor runs kinit)."""
    from confluent_kafka import KafkaException, Producer

    try:
        Producer(without_kinit({"security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanism": GSSAPI, "log_level": 0}))
    except KafkaException as exc:
        return str(exc.args[0].str() if exc.args else exc)
    return None


# librdkafka properties that say how to authenticate, and those that hold a secret.
_SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")
_SECRETS = ("sasl.password", "ssl.key.password", "ssl.key.pem", "ssl.keystore.password",
            "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "sasl.oauthbearer.assertion.private.key.pem")


def check_settings(values: dict, section: str, options_key: str,
                   files: bool = True) -> KafkaSecurity:
    """The security settings of ``section`` checked (``KafkaSecurity.check``; with ``files``
    False only their form: a process that only reads the configuration, such as the dashboard,
    need not reach a service's credentials), and the pass-through options at ``options_key``:
    no secret written there (it belongs in a file), and no security property beside the
    security keys (set once). Returns the settings."""
    security = KafkaSecurity.from_values(values, section)
    security.check() if files else security.check_form()
    for key in values.get(options_key, {}):
        if key in _SECRETS:
            raise ConfigError(f"{options_key}.{key}", "a secret written in the configuration "
                              "file", hint=f"put it in a file readable by this service's user "
                              f"only and name that file: [{section}] sasl_password_file, "
                              "sasl_oauthbearer_client_secret_file or ssl_key_password_file "
                              "(docs/security.md)")
        if security.secured and key.startswith(_SECURITY_PREFIXES):
            raise ConfigError(f"{options_key}.{key}", "a security property beside "
                              f"[{section}] security_protocol = {security.protocol!r}",
                              hint=f"set security once: with the [{section}] security keys, "
                              "or (for what they do not cover) here alone")
    return security


def read_kafka_config(path: str | Path, other_sections: tuple[str, ...] = ()) -> KafkaSecurity:
    """The ``[kafka]`` table of ``--kafka-config FILE`` (the Spark jobs', the mirror's watcher's),
    checked: its form and its files. ``other_sections``: the file's tables read by others (a
    job's ``--config`` file holds its ``[job]`` table beside)."""
    values = parse_sections(load_toml(path), settings("kafka"), other_sections)
    return check_settings(values, "kafka", "kafka.librdkafka_options")


def kafka_config_text(security: KafkaSecurity) -> str:
    """A ``--kafka-config`` file's text holding ``security`` (``read_kafka_config`` reads it)."""
    return "[kafka]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in security.table().items())


# Keys whose value is a secret, under any prefix (``kafka.`` for Spark, a cluster's alias for
# MirrorMaker 2).
SECRET_KEYS = ("sasl.password", "ssl.key.password", "sasl.jaas.config", "ssl.keystore.key",
               "ssl.key.pem", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
               "sasl.oauthbearer.assertion.private.key.passphrase",
               "sasl.oauthbearer.assertion.private.key.pem")


def redact(conf: dict) -> dict:
    """``conf`` fit to print or log: every secret replaced."""
    return {k: ("(redacted)" if k.endswith(SECRET_KEYS) or "password" in k or "secret" in k
                else v) for k, v in conf.items()}


def resolve(path: str) -> str:
    """``path`` with a leading ``${CREDENTIALS_DIRECTORY}`` replaced by systemd's folder of
    this service's credentials."""
    if path.startswith(CREDENTIALS):
        folder = os.environ.get("CREDENTIALS_DIRECTORY")
        if not folder:
            raise ConfigError(path, "names ${CREDENTIALS_DIRECTORY}, which is not set",
                              hint="run under systemd with LoadCredential=, or give the path")
        return folder + path[len(CREDENTIALS):]
    return path


def read_secret(key: str, path: str) -> str:
    """The first line of the secret file at ``path`` (setting ``key``), without its newline."""
    try:
        text = Path(resolve(path)).read_text()
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror}",
                          hint="the file must exist and be readable by this service's "
                          "user") from None
    secret = text.splitlines()[0] if text else ""
    if not secret:
        raise ConfigError(key, f"{path} is empty", hint="write the secret on its first line")
    return secret


def _check_file(key: str, path: str, secret: bool) -> None:
    real = resolve(path)
    try:
        st = os.stat(real)
        with open(real, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror}",
                          hint="the file must exist and be readable by this service's "
                          "user") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(key, f"{path} is not a regular file")
    if secret and st.st_mode & stat.S_IROTH:
        raise ConfigError(key, f"{path} is readable by every user (mode "
                          f"{stat.S_IMODE(st.st_mode):04o})",
                          hint=f"chmod 600 {path} (or 640 with a group only the service has)")


def _check_endpoint(key: str, url: str) -> None:
    """A token endpoint's URL: https (plain http only to this host: the client secret goes in
    every request), a host, no user or password in it (it is shown in status and logs), no
    comma or space (Java clients allow endpoints by a comma-separated list)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port                                    # noqa: B018 - a bad port raises here
    except ValueError as exc:
        raise ConfigError(key, f"{url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(key, f"{url!r} is not an http(s) URL with a host",
                          hint="e.g. https://idp.example.com/oauth2/token")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigError(key, f"{url!r} would send the client secret unencrypted to another "
                          "host", hint="use the endpoint's https URL (plain http is taken "
                          "for 127.0.0.1, ::1 and localhost only)")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(key, "holds a user or password", hint="the client's id and secret "
                          "are sasl_oauthbearer_client_id and its secret file")
    if any(c in url for c in ", \t\n"):
        raise ConfigError(key, f"{url!r} holds a comma or a space")


def _jaas(value: str) -> str:
    """A value inside a JAAS option's double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
