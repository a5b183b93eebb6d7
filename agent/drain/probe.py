"""Does the cluster answer? Asked by a client of its own, never by the producer in question.

The drain asks when its producer has had nothing acknowledged for a while (``Drain``'s
liveness watch): a cluster that does not answer is an outage; one that answers while the
producer stays silent is a producer that stopped sending (it is replaced). So the question must
not go through the producer: seen here after a 30 s broker pause, a producer re-bootstrapping
sat with no connection to any broker, and a metadata request of its own waited with it
(unanswered: a false outage that never ended), while a new client was answered at once.

Each question is a new admin client's metadata request (``probe_factory``: librdkafka's, or a
test's stand-in), answered within ``timeout_s``, in a thread of its own so the agent's loop
never waits for it; the client is dropped when the answer is in. A client costs about 5 ms of
CPU (measured here: 10 clients, each asking a closed port); the drain asks at most once a
second.

With OAUTHBEARER (OpenID Connect) every new client would ask the identity provider for a token
at once: during an outage, each agent about once a second — a fleet's worth of requests a
second on a provider that may limit them. The probes share one token instead (``TokenCache``,
through confluent-kafka's ``oauth_cb``), asked for again when four fifths of its life are over
(its life: the shorter of the endpoint's ``expires_in`` and the token's own ``exp``), or at once
when the cluster refused it. The request is the standard library's (``urllib``): a producer
host's agent carries no HTTP client of its own.

With Kerberos (GSSAPI) every new client runs ``kinit`` when it is made, asking the KDC for a
ticket: during an outage whose cause is the login (a stale keytab, the KDC away), each agent
would ask about once a second (measured: two refused requests a second at the KDC). The probes
share the ticket cache of the agent's principal (``own_ticket_cache``): one probe in
``KINIT_EVERY_S`` runs ``kinit``, the others use the cache as it is.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from docket_common.kafka_security import without_kinit

from .topics import connection_conf

PROBE_TIMEOUT_S = 1.0
REFUSED_RETRY_S = 5.0          # a token endpoint that refused is asked again after this
KINIT_EVERY_S = 10.0           # a probe's kinit at most this often per principal (GSSAPI)


def admin_client(conf: dict) -> AdminClient:
    """The probe's client: librdkafka's admin client, logging where the agent's clients do."""
    return AdminClient(conf, logger=logging.getLogger("docket.agent.librdkafka"))


class _Answer:
    def __init__(self, status: int, body: bytes):
        self.status, self.body = status, body

    def raise_for_status(self) -> None:
        if self.status >= 400:
            raise RuntimeError(f"HTTP {self.status}: {self.body[:200].decode(errors='replace')}")

    def json(self):
        return json.loads(self.body)


class _Urllib:
    """An HTTP POST of a form with HTTP Basic credentials, by the standard library."""

    def post(self, url: str, data: dict, auth: tuple[str, str], verify, timeout: float):
        basic = base64.b64encode(":".join(auth).encode()).decode()   # as librdkafka sends it
        request = urllib.request.Request(
            url, data=urllib.parse.urlencode(data).encode(), method="POST",
            headers={"Authorization": f"Basic {basic}", "Accept": "application/json",
                     "Content-Type": "application/x-www-form-urlencoded"})
        context = None
        if url.startswith("https:"):
            context = ssl.create_default_context(
                cafile=verify if isinstance(verify, str) else None)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
                return _Answer(answer.status, answer.read())
        except urllib.error.HTTPError as exc:
            return _Answer(exc.code, exc.read())


def _claimed_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (not verified: the cluster does that), None when it has none."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


class TokenCache:
    """One OAUTHBEARER token of the client credentials in librdkafka settings, asked for from
    their token endpoint (OIDC's client credentials grant, HTTP Basic, as librdkafka asks) when
    there is none, four fifths of its life are over, or the cluster refused it (``refused``);
    ``token`` is confluent-kafka's ``oauth_cb``."""

    def __init__(self, conf: dict, session=None):
        self.url = conf["sasl.oauthbearer.token.endpoint.url"]
        self._auth = (conf["sasl.oauthbearer.client.id"], conf["sasl.oauthbearer.client.secret"])
        self._scope = conf.get("sasl.oauthbearer.scope")
        self._verify = conf.get("https.ca.location") or True
        self._session = session
        self._lock = threading.Lock()
        self._token: tuple[str, float] | None = None      # (token, expiry: epoch s)
        self._renew_at = 0.0
        self._refused: tuple[float, str] | None = None   # the last refusal: when, why
        self.asked = 0                                    # requests made

    def token(self, _config: str | None = None) -> tuple[str, float]:
        """The shared token; an endpoint that refused is not asked again for
        ``REFUSED_RETRY_S`` (the refusal is raised again meanwhile)."""
        with self._lock:
            now = time.time()
            if self._token is not None and now < self._renew_at:
                return self._token
            if self._refused is not None and now - self._refused[0] < REFUSED_RETRY_S:
                raise RuntimeError(self._refused[1])
            try:
                self._token, self._renew_at = self._ask(now)
            except Exception as exc:
                self._refused = (now, f"the token endpoint {self.url} refused: {exc}")
                raise RuntimeError(self._refused[1]) from None
            self._refused = None
            return self._token

    def refused(self) -> None:
        """The cluster refused the token (a probe's authentication failed): the next probe
        asks for a new one (an expired or revoked token would otherwise be kept till its
        renewal)."""
        with self._lock:
            self._token, self._renew_at = None, 0.0

    def _ask(self, now: float) -> tuple[tuple[str, float], float]:
        session = self._session or _Urllib()
        form = {"grant_type": "client_credentials"}
        if self._scope:
            form["scope"] = self._scope
        self.asked += 1
        answer = session.post(self.url, data=form, auth=self._auth, verify=self._verify,
                              timeout=PROBE_TIMEOUT_S * 5)
        answer.raise_for_status()
        body = answer.json()
        token = body["access_token"]
        expiry = now + float(body.get("expires_in") or 60)
        claimed = _claimed_expiry(token)
        if claimed is not None:
            expiry = min(expiry, claimed)
        return (token, expiry), now + 0.8 * max(0.0, expiry - now)


_tokens: dict[tuple, TokenCache] = {}
_tokens_lock = threading.Lock()


_kinit_at: dict[str, float] = {}     # principal → when a probe's client last ran kinit


def _kerberos_conf(out: dict, now: float) -> dict:
    """GSSAPI: ``out`` as it is for one probe in ``KINIT_EVERY_S`` (its client runs kinit),
    else with librdkafka's refresh off (the client logs in with the cached ticket)."""
    principal = out.get("sasl.kerberos.principal", "")
    with _tokens_lock:
        last = _kinit_at.get(principal)
        if last is None or now - last >= KINIT_EVERY_S:
            _kinit_at[principal] = now
            return out
    return without_kinit(out)


def probe_conf(conf: dict, now: float | None = None) -> dict:
    """The probe's settings of the producer settings ``conf``: how to reach and authenticate to
    the cluster; with OAUTHBEARER's OIDC method, the token the probes share in its place; with
    GSSAPI, a kinit in one probe of ``KINIT_EVERY_S`` only."""
    out = connection_conf(conf)
    if out.get("sasl.mechanism") == "GSSAPI":
        return _kerberos_conf(out, time.monotonic() if now is None else now)
    needed = ("sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.id",
              "sasl.oauthbearer.client.secret")
    if out.get("sasl.oauthbearer.method") != "oidc" or not all(out.get(k) for k in needed):
        return out                  # librdkafka's own settings as they are (it says what lacks)
    key = (*(out[k] for k in needed), out.get("sasl.oauthbearer.scope"),
           out.get("https.ca.location"))
    with _tokens_lock:
        cache = _tokens.get(key)
        if cache is None:
            _tokens.clear()                 # credentials changed (a reload): the old ones go
            cache = _tokens[key] = TokenCache(out)
    out = {k: v for k, v in out.items() if not k.startswith("sasl.oauthbearer.")}
    out["oauth_cb"] = cache.token

    def error(err: KafkaError) -> None:
        if err.code() == KafkaError._AUTHENTICATION:
            cache.refused()
    out["error_cb"] = error
    return out


def cluster_answers(conf: dict, factory: Callable[[dict], object] = admin_client,
                    timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Does the cluster of the producer settings ``conf`` answer a new client's metadata
    request within ``timeout_s``? (Waits for the answer: call it from a thread of its own.)"""
    try:
        client = factory(probe_conf(conf))
    except KafkaException:               # no token (OAUTHBEARER: the endpoint refused)
        return False
    try:
        client.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False
    finally:
        poll = getattr(client, "poll", None)
        if poll is not None:
            poll(0)                     # hand its log lines to the logger


class Probe:
    """One question (``cluster_answers``) in a thread of its own: ``answered`` is None until
    the answer is in."""

    def __init__(self, conf: dict, factory: Callable[[dict], object] = admin_client,
                 timeout_s: float = PROBE_TIMEOUT_S):
        self.answered: bool | None = None
        threading.Thread(target=self._run, args=(conf, factory, timeout_s), daemon=True,
                         name="docket-probe").start()

    def _run(self, conf: dict, factory, timeout_s: float) -> None:
        try:
            self.answered = cluster_answers(conf, factory, timeout_s)
        except Exception:            # a client that cannot even be made: no answer
            logging.getLogger("docket.agent.drain").warning(
                "cannot ask the cluster whether it answers", exc_info=True)
            self.answered = False
