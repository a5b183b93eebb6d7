"""An OpenID Connect identity provider on 127.0.0.1 for the OAUTHBEARER tests: the token
endpoint of the client credentials grant (over TLS, its certificate self-signed for
127.0.0.1: clients trust it through ``ca_file``), and the key set the brokers check tokens
against.

Tokens are JWTs signed RS256 with a key ``openssl`` makes (the signature too is ``openssl``'s:
RSASSA-PKCS1-v1_5 over SHA-256), with ``sub`` the client's id — the principal the brokers
authorise (``User:<client id>``) —, ``iss``, ``aud``, ``iat``, ``exp`` and ``scope``. The key
set is a file (``jwks.json``) the brokers read through a ``file:`` URL, allowed by name in
their JVM (``java_options``). A client logs in with HTTP Basic (id and secret), as librdkafka
and the Java client both do; anything else gets a 401 and is counted.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

AUDIENCE = "docket"
KEY_ID = "docket-test-1"
VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class IdentityProvider:
    """Start with ``start()``, stop with ``stop()``; ``clients`` maps id → secret."""

    def __init__(self, folder: Path, clients: dict[str, str], lifetime_s: int = 3600):
        self.folder, self.clients, self.lifetime_s = folder, dict(clients), lifetime_s
        self.key = folder / "idp.key"
        self.jwks = folder / "jwks.json"
        self.ca_file = folder / "tls.crt"          # the endpoint's certificate, self-signed
        self._tls_key = folder / "tls.key"
        self.issued: Counter = Counter()        # client id → tokens issued
        self.refused: Counter = Counter()       # client id (or "?") → requests refused
        # A provider whose tokens the brokers find expired (its clock behind theirs): each
        # token's ``exp`` a minute past, ``expires_in`` short, so clients ask again soon.
        self.expired = False
        self.expired_issued: Counter = Counter()
        self._server: ThreadingHTTPServer | None = None

    # -- keys ---------------------------------------------------------------------------------
    def _make_key(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                        "rsa_keygen_bits:2048", "-out", str(self.key)], check=True,
                       capture_output=True)
        out = subprocess.run(["openssl", "rsa", "-in", str(self.key), "-noout", "-modulus"],
                             check=True, capture_output=True, text=True).stdout
        modulus = bytes.fromhex(out.strip().split("=", 1)[1])
        self.jwks.write_text(json.dumps({"keys": [{
            "kty": "RSA", "kid": KEY_ID, "use": "sig", "alg": "RS256",
            "n": _b64(modulus), "e": _b64((65537).to_bytes(3, "big"))}]}))
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-keyout", str(self._tls_key), "-out", str(self.ca_file),
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)

    def token(self, client_id: str, scope: str | None = None, lifetime_s: int | None = None
              ) -> str:
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": KEY_ID}
        lifetime = self.lifetime_s if lifetime_s is None else lifetime_s
        claims = {"sub": client_id, "iss": self.issuer, "aud": AUDIENCE,
                  "iat": min(now, now + lifetime - 60), "exp": now + lifetime}
        if scope:
            claims["scope"] = scope
        signing_input = f"{_b64(json.dumps(header).encode())}." \
                        f"{_b64(json.dumps(claims).encode())}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                                   input=signing_input.encode(), check=True,
                                   capture_output=True).stdout
        return f"{signing_input}.{_b64(signature)}"

    # -- the endpoint -------------------------------------------------------------------------
    def start(self) -> IdentityProvider:
        self._make_key()
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):                  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode(errors="replace"))
                who, secret = _basic(self.headers.get("Authorization", ""))
                if self.path != "/token" or form.get("grant_type") != ["client_credentials"] \
                        or idp.clients.get(who) != secret:
                    idp.refused[who or "?"] += 1
                    return self._answer(401, {"error": "invalid_client"})
                scope = form.get("scope", [None])[0]
                if idp.expired:
                    idp.expired_issued[who] += 1
                    return self._answer(200, {"access_token": idp.token(who, scope, -60),
                                              "token_type": "Bearer", "expires_in": 5})
                idp.issued[who] += 1
                self._answer(200, {"access_token": idp.token(who, scope), "token_type": "Bearer",
                                   "expires_in": idp.lifetime_s})

            def _answer(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args):      # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(self.ca_file, self._tls_key)
        self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, name="idp", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def token_url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/token"

    @property
    def issuer(self) -> str:
        return "docket-test-idp"

    # -- what the brokers need ----------------------------------------------------------------
    def broker_props(self, listener: str = "sasl_ssl") -> dict[str, str]:
        """``server.properties`` beside a SCRAM listener's: OAUTHBEARER enabled on it too,
        tokens checked against the key set, the issuer and the audience."""
        prefix = f"listener.name.{listener}.oauthbearer"
        return {
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,OAUTHBEARER",
            f"{prefix}.sasl.server.callback.handler.class": VALIDATOR,
            f"{prefix}.sasl.jaas.config": f"{LOGIN_MODULE} required ;",
            "sasl.oauthbearer.jwks.endpoint.url": self.jwks.as_uri(),
            "sasl.oauthbearer.expected.audience": AUDIENCE,
            "sasl.oauthbearer.expected.issuer": self.issuer,
        }

    def java_options(self) -> list[str]:
        return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.jwks.as_uri()}"]


def _basic(header: str) -> tuple[str | None, str | None]:
    if not header.startswith("Basic "):
        return None, None
    try:
        who, _, secret = base64.b64decode(header[6:]).decode().partition(":")
    except ValueError:
        return None, None
    return who, secret
