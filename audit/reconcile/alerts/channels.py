"""Where alerts go: a webhook (generic JSON or Slack-compatible), e-mail over SMTP, or a
Prometheus Alertmanager.

Every channel sends one notification per call and reduces the outcome to three cases, in one
place per transport: it returns (delivered), or raises :class:`DeliveryFailed` with
``retryable`` true (try again later: timeouts, refused connections, HTTP 408/429/5xx, SMTP 4xx)
or false (trying again cannot help: other HTTP 4xx, SMTP 5xx, a redirect). Every send is bounded
by the channel's ``timeout_ms`` per connect and per read, so a dead receiver costs one timeout.

The idempotency key passed to :meth:`Channel.send` is the same on every attempt of one event on
one channel; each channel hands it to its receiver (``Idempotency-Key`` header, ``Message-ID``)
so a receiver can drop what it already has. See docs/alerts.md for the bodies.
"""

from __future__ import annotations

import email.policy
import json
import logging
import smtplib
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from email.message import EmailMessage
from email.utils import formatdate, parseaddr, parsedate_to_datetime
from typing import Protocol, runtime_checkable
from urllib.parse import urljoin, urlsplit

import requests

from docket_common.formats import utc_iso

from .. import channel_settings as config
from ..channel_settings import ChannelConfigError
from .notification import Notification, digest_summary, idempotency_key

__all__ = ["AlertmanagerChannel", "Channel", "ChannelConfigError", "DeliveryFailed",
           "EmailChannel", "WebhookChannel", "channel_from_config"]

USER_AGENT = "docket-alerts/1"
log = logging.getLogger("docket.audit.reconcile.alerts")


class DeliveryFailed(Exception):
    """A send that did not deliver. ``retryable``: the same send may work later.
    ``retry_after_ms``: the receiver asked to wait this long (HTTP ``Retry-After``)."""

    def __init__(self, message: str, retryable: bool, retry_after_ms: int | None = None):
        super().__init__(message)
        self.message, self.retryable, self.retry_after_ms = message, retryable, retry_after_ms


@runtime_checkable
class Channel(Protocol):
    name: str
    max_per_period: int           # messages in any ``period_ms`` (0: no limit)
    period_ms: int

    def send(self, n: Notification, idempotency_key: str) -> None:
        """Deliver ``n`` or raise :class:`DeliveryFailed`."""

    def send_digest(self, ns: list[Notification], idempotency_key: str) -> None:
        """Deliver ``ns`` (notifications the rate limit held back) as one message, or raise
        :class:`DeliveryFailed`."""


class RateLimited:
    """The rate limit every channel takes (``max_per_period``, ``period_ms``; the outbox's
    dispatcher keeps it)."""
    max_per_period: int = 0
    period_ms: int = 600_000

    def _limit(self, max_per_period: int, period_ms: int) -> None:
        if max_per_period < 0 or period_ms <= 0:
            raise ValueError("need max_per_period >= 0 and period_ms > 0")
        self.max_per_period, self.period_ms = max_per_period, period_ms

    def held_back(self, ns: list[Notification]) -> str:
        return digest_summary(ns, self.max_per_period, self.period_ms)


# -- HTTP ---------------------------------------------------------------------------------------
def _retry_after_ms(value: str | None, now: float) -> int | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value) * 1000
    try:
        return max(0, int((parsedate_to_datetime(value).timestamp() - now) * 1000))
    except (TypeError, ValueError):
        return None


def shown(url: str, path: bool = False) -> str:
    """``url`` as errors and logs show it: no user or password, and no path unless ``path``
    (a webhook's path often holds its secret, as Slack's do)."""
    parts = urlsplit(url)
    where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    if path:
        return where + parts.path
    return where + ("/…" if parts.path.strip("/") or parts.query else "")


def _post_json(url: str, body, headers: Mapping[str, str], timeout_ms: int,
               ca_file: str | None, show_path: bool = False) -> None:
    """POST ``body`` as JSON; 2xx delivers, anything else raises :class:`DeliveryFailed`."""
    timeout_s = timeout_ms / 1000
    where = shown(url, show_path)
    try:
        response = requests.post(
            url, data=json.dumps(body, separators=(",", ":")).encode(),
            headers={"User-Agent": USER_AGENT, **headers,
                     "Content-Type": "application/json"},
            timeout=(timeout_s, timeout_s), allow_redirects=False, verify=ca_file or True)
    except requests.Timeout as exc:
        raise DeliveryFailed(f"no answer from {where} within {timeout_ms} ms", True) from exc
    except requests.ConnectionError as exc:
        raise DeliveryFailed(f"cannot reach {where}: {_root(exc)}", True) from exc
    except requests.RequestException as exc:
        raise DeliveryFailed(f"cannot send to {where}: {type(exc).__name__}", False) from exc
    with response:
        status = response.status_code
        if 200 <= status < 300:
            return
        said = " ".join(response.text[:200].split())
        message = f"{where} answered {status} {response.reason}" + \
            (f": {said}" if said else "")
        if 300 <= status < 400:
            to = shown(urljoin(url, response.headers.get("Location", "")), show_path)
            raise DeliveryFailed(f"{message} (redirected to {to}; configure the final "
                                 "address)", False)
        retryable = status in (408, 429) or status >= 500
        raise DeliveryFailed(message, retryable,
                             _retry_after_ms(response.headers.get("Retry-After"), time.time()))


def _root(exc: BaseException) -> str:
    """The innermost cause of a requests error, which says what actually happened
    (``[Errno 111] Connection refused``) without urllib3's wrapping."""
    while exc.__context__ is not None and exc.__context__ is not exc:
        exc = exc.__context__
    return str(exc) or type(exc).__name__


def _mrkdwn(text: str) -> str:
    """Slack's three escapes, so names from the data are shown, never interpreted."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(n: Notification) -> dict:
    """A Slack-compatible incoming-webhook message: ``text`` and one attachment with a field
    per fact and per detail (Mattermost and Rocket.Chat read the same)."""
    fields = [{"title": label, "value": _mrkdwn(value), "short": True}
              for label, value in n.facts()]
    fields += [{"title": _mrkdwn(key), "value": _mrkdwn(value if len(value) <= 500
                                                        else value[:499] + "…"),
                "short": len(value) <= 40}
               for key, value in n.detail_lines()]
    text = _mrkdwn(f"{n.headline()}: {n.summary}")
    return {"text": text,
            "attachments": [{"fallback": text, "color": "#2eb886" if n.event == "resolved"
                             else "#d40e0d", "title": _mrkdwn(n.summary), "fields": fields,
                             "footer": f"docket alert {n.alert_id}",
                             "ts": (n.resolved_at or n.fired_at) // 1000}]}


def slack_digest(summary: str, ns: list[Notification]) -> dict:
    """A digest as a Slack-compatible message: the summary, and a line per notification (the
    first 50)."""
    lines = [_mrkdwn(f"{n.headline()}: {n.summary}") for n in ns[:50]]
    if len(ns) > 50:
        lines.append(f"… and {len(ns) - 50} more")
    return {"text": _mrkdwn(summary),
            "attachments": [{"fallback": _mrkdwn(summary), "color": "#e8a317",
                             "title": _mrkdwn(summary), "text": "\n".join(lines),
                             "footer": "docket alert digest"}]}


class WebhookChannel(RateLimited):
    """POST to a URL: the notification as JSON (``format="json"``) or a Slack-compatible
    message (``format="slack"``), with the ``Idempotency-Key`` header."""

    def __init__(self, name: str, url: str, format: str = "json", timeout_ms: int = 5000,
                 headers: Mapping[str, str] | None = None, ca_file: str | None = None,
                 max_per_period: int = 100, period_ms: int = 600_000):
        if format not in ("json", "slack"):
            raise ValueError(f"format must be 'json' or 'slack', not {format!r}")
        self.name, self.url, self.format, self.timeout_ms = name, url, format, timeout_ms
        self.headers, self.ca_file = dict(headers or {}), ca_file
        self._limit(max_per_period, period_ms)

    def digest_body(self, ns: list[Notification], idempotency_key: str) -> dict:
        if self.format == "slack":
            return slack_digest(self.held_back(ns), ns)
        return {"v": 1, "digest": True, "summary": self.held_back(ns), "held_back": len(ns),
                "max_per_period": self.max_per_period, "period_ms": self.period_ms,
                "notifications": [n.to_json() for n in ns], "idempotency_key": idempotency_key}

    def send_digest(self, ns: list[Notification], idempotency_key: str) -> None:
        _post_json(self.url, self.digest_body(ns, idempotency_key),
                   {**self.headers, "Idempotency-Key": idempotency_key}, self.timeout_ms,
                   self.ca_file)

    def body(self, n: Notification, idempotency_key: str) -> dict:
        if self.format == "slack":
            return slack_body(n)
        return {**n.to_json(), "idempotency_key": idempotency_key}

    def send(self, n: Notification, idempotency_key: str) -> None:
        _post_json(self.url, self.body(n, idempotency_key),
                   {**self.headers, "Idempotency-Key": idempotency_key}, self.timeout_ms,
                   self.ca_file)

    def __repr__(self):
        return f"WebhookChannel({self.name!r}, {shown(self.url)!r}, format={self.format!r})"


# -- Alertmanager -------------------------------------------------------------------------------
def alertname(kind: str) -> str:
    """``loss`` → ``DocketLoss``, ``checksum_mismatch`` → ``DocketChecksumMismatch``."""
    return "Docket" + "".join(part.capitalize() for part in kind.split("_"))


def alertmanager_alert(n: Notification, now_ms: int, firing_hold_ms: int,
                       generator_url: str | None = None) -> dict:
    """One alert of Alertmanager's API v2. Its labels identify it (the same for the firing and
    the resolved event, so Alertmanager merges them); a firing alert ends ``firing_hold_ms``
    after ``now_ms``, a resolved one at ``resolved_at``."""
    labels = {"alertname": alertname(n.kind), "alert_class": n.alert_class,
              "severity": n.severity, "topic": n.topic,
              "window": None if n.window_start is None else utc_iso(n.window_start),
              "tier": n.tier, "origin": n.origin, "owner": n.owner}
    alert = {
        "labels": {k: v for k, v in labels.items() if v is not None},
        "annotations": {"summary": n.summary,
                        "description": json.dumps(n.detail, sort_keys=True),
                        "alert_id": str(n.alert_id)},
        "startsAt": utc_iso(n.fired_at, millis=True),
        "endsAt": utc_iso(n.resolved_at if n.event == "resolved" else now_ms + firing_hold_ms,
                          millis=True),
    }
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert


class AlertmanagerChannel(RateLimited):
    """POST one alert to ``{url}/api/v2/alerts``. Alertmanager deduplicates by labels itself;
    the idempotency key is not sent."""

    def __init__(self, name: str, url: str, timeout_ms: int = 5000,
                 firing_hold_ms: int = 7 * 24 * 3600 * 1000, generator_url: str | None = None,
                 ca_file: str | None = None, clock: Callable[[], float] = time.time,
                 max_per_period: int = 0, period_ms: int = 600_000):
        self.name, self.url, self.timeout_ms = name, url.rstrip("/"), timeout_ms
        self._limit(max_per_period, period_ms)
        self.firing_hold_ms, self.generator_url, self.ca_file = (firing_hold_ms, generator_url,
                                                                 ca_file)
        self._clock = clock        # Alertmanager's clock is the wall clock: endsAt counts on it

    def send(self, n: Notification, idempotency_key: str) -> None:
        self.send_digest([n], idempotency_key)

    def send_digest(self, ns: list[Notification], idempotency_key: str) -> None:
        """Alertmanager's API takes a list: a digest is every alert in one POST."""
        now_ms = int(self._clock() * 1000)
        alerts = [alertmanager_alert(n, now_ms, self.firing_hold_ms, self.generator_url)
                  for n in ns]
        _post_json(f"{self.url}/api/v2/alerts", alerts, {}, self.timeout_ms, self.ca_file,
                   show_path=True)

    def __repr__(self):
        return f"AlertmanagerChannel({self.name!r}, {shown(self.url, True)!r})"


# -- e-mail -------------------------------------------------------------------------------------
# Headers fold only past RFC 5322's hard limit: Python folds a subject just over 78 characters
# before its first word, which some readers show with a leading space.
_MAIL_POLICY = email.policy.default.clone(max_line_length=998)

class EmailChannel(RateLimited):
    """One plain-text e-mail per event over SMTP, optionally with STARTTLS and AUTH. The
    ``Message-ID`` is made of the idempotency key; a resolved event refers to its firing one
    (``In-Reply-To``), so mail readers thread them."""

    def __init__(self, name: str, host: str, port: int, sender: str, recipients: Sequence[str],
                 starttls: bool = False, username: str | None = None,
                 password: str | None = None, timeout_ms: int = 10000,
                 ca_file: str | None = None, max_per_period: int = 100,
                 period_ms: int = 600_000):
        if not recipients:
            raise ValueError("an e-mail channel needs at least one recipient")
        if (username is None) != (password is None):
            raise ValueError("username and password go together")
        self.name, self.host, self.port, self.sender = name, host, port, sender
        self.recipients, self.starttls = list(recipients), starttls
        self.username, self.password, self.timeout_ms = username, password, timeout_ms
        self.ca_file = ca_file
        self._limit(max_per_period, period_ms)
        self.domain = parseaddr(sender)[1].rpartition("@")[2] or "docket.invalid"

    def _envelope(self, subject: str, idempotency_key_: str) -> EmailMessage:
        msg = EmailMessage(policy=_MAIL_POLICY)
        msg["Subject"] = f"[docket] {subject}"
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.recipients)
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = f"<{idempotency_key_}@{self.domain}>"
        msg["Auto-Submitted"] = "auto-generated"
        return msg

    def digest_message(self, ns: list[Notification], idempotency_key_: str) -> EmailMessage:
        """One message for a digest: the summary, then each notification's account."""
        summary = self.held_back(ns)
        msg = self._envelope(summary, idempotency_key_)
        msg["X-Docket-Event"] = "digest"
        rule = "\n" + "-" * 72 + "\n"
        msg.set_content(summary + "\n" + rule + rule.join(n.text() for n in ns)
                        + f"\nIdempotency key: {idempotency_key_}\n")
        return msg

    def send_digest(self, ns: list[Notification], idempotency_key: str) -> None:
        self._deliver(self.digest_message(ns, idempotency_key), f"a digest of {len(ns)}")

    def message(self, n: Notification, idempotency_key_: str) -> EmailMessage:
        msg = self._envelope(n.headline(), idempotency_key_)
        if n.event == "resolved":
            first = f"<{idempotency_key(n.alert_id, 'firing', self.name)}@{self.domain}>"
            msg["In-Reply-To"] = first
            msg["References"] = first
        msg["X-Docket-Alert-Id"] = str(n.alert_id)
        msg["X-Docket-Event"] = n.event
        msg.set_content(n.text() + f"\nIdempotency key: {idempotency_key_}\n")
        return msg

    def send(self, n: Notification, idempotency_key: str) -> None:
        self._deliver(self.message(n, idempotency_key), f"alert {n.alert_id} {n.event}")

    def _deliver(self, msg: EmailMessage, what: str) -> None:
        where = f"SMTP {self.host}:{self.port}"
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout_ms / 1000) as smtp:
                if self.starttls:
                    smtp.starttls(context=ssl.create_default_context(cafile=self.ca_file))
                if self.username is not None:
                    smtp.login(self.username, self.password)
                refused = smtp.send_message(msg)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            raise DeliveryFailed(f"{where} refused every recipient: {_refusals(exc.recipients)}",
                                 any(400 <= c < 500 for c in codes)) from exc
        except smtplib.SMTPResponseException as exc:
            raise DeliveryFailed(f"{where} answered {exc.smtp_code} {_said(exc.smtp_error)}",
                                 400 <= exc.smtp_code < 500) from exc
        except smtplib.SMTPServerDisconnected as exc:
            raise DeliveryFailed(f"{where} closed the connection: {exc}", True) from exc
        except smtplib.SMTPNotSupportedError as exc:
            raise DeliveryFailed(f"{where}: {exc} (check starttls and username)", False) from exc
        except smtplib.SMTPException as exc:
            raise DeliveryFailed(f"{where}: {exc}", False) from exc
        except TimeoutError as exc:
            raise DeliveryFailed(f"{where}: no answer within {self.timeout_ms} ms", True) \
                from exc
        except OSError as exc:             # refused, unreachable, TLS failures
            raise DeliveryFailed(f"cannot reach {where}: {exc}", True) from exc
        if refused:
            # Some recipients have it: sending again would give them a second copy.
            log.warning("channel %s: %s delivered, but %s refused %s", self.name, what, where,
                        _refusals(refused))

    def __repr__(self):
        return f"EmailChannel({self.name!r}, {self.host!r}, {self.port})"


def _said(reply: bytes | str) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)


def _refusals(recipients: dict) -> str:
    return "; ".join(f"{addr}: {code} {_said(msg)}" for addr, (code, msg) in recipients.items())


# -- configuration ------------------------------------------------------------------------------
_TYPES = {"webhook": WebhookChannel, "email": EmailChannel, "alertmanager": AlertmanagerChannel}


def channel_from_config(name: str, table: dict) -> Channel:
    """The channel a ``[channels.NAME]`` table describes. Raises :class:`ChannelConfigError`
    naming the key at fault (``channels.NAME.url``)."""
    kind, values = config.parse(name, table)
    return _TYPES[kind](name, **values)
