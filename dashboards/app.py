"""The audit dashboard: server-rendered pages over the reconciler's database, and the JSON API
they are built from.

Pages: ``/`` (overview: topics × recent windows of one tier, coloured by its state end to end
or at its hop, the tiers' totals, the open alerts), ``/topic/{topic}`` (the correlation view:
the producer against every tier), ``/window/{topic}/{start}``
(per origin, with the missing record numbers and the command that locates them),
``/alerts`` (open, snoozed, resolved; snooze and resolve), ``/health`` (per tier: the newest
window, the jobs' lag). API: ``/api/completeness``, ``/api/tiers``, ``/api/alerts``,
``/api/watermark``, ``/api/window``, ``/api/topic``, ``/api/health``.

What feeds each tier (the hops' labels, the graph order) comes from the reconciler's
configuration (``config``); without one it is not known, and the tiers are in the default order.

Every name from the data goes through Jinja2's autoescaping; the pages load nothing but this
server's ``/static/`` files. Forms that change something (snooze, resolve) carry a CSRF token
tied to this process and are refused without it. With ``token`` set, every request needs it:
``Authorization: Bearer TOKEN``, or HTTP basic auth with the token as password (browsers).
"""

from __future__ import annotations

import base64
import hmac
import os
import time
from contextlib import closing
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from audit.reconcile import config as rconfig
from audit.reconcile.alerts.lifecycle import resolve_by_hand, snooze
from audit.reconcile.store import Store, StoreMissing
from audit.reconcile.watermark import watermark
from docket_common.formats import percent, utc_iso

from . import data

HERE = Path(__file__).parent
HOUR_MS = 3600 * 1000
RANGES = {"1h": 1, "6h": 6, "24h": 24, "7d": 24 * 7}      # ?range=: how far back
DEFAULT_RANGE = "24h"
SNOOZES = {"1h": 1, "4h": 4, "24h": 24}
# ?measure=: what colours the overview: the state end to end (a tier complete at its hop but
# short of what the producers accepted shows so), or the state and completeness at its hop.
MEASURES = ("end_to_end", "hop")
DEFAULT_MEASURE = "end_to_end"
TOPICS_PER_PAGE = 100           # the overview's rows: 100 topics × a day is 14,400 cells


LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1"]


def create_app(db: Path, token: str | None = None, config: Path | None = None,
               clock=time.time, hosts: list[str] | None = None) -> Starlette:
    """``hosts``: the Host headers accepted without a token (default: loopback names), so a
    page elsewhere whose name was rebound to 127.0.0.1 cannot read or act here. ``config``:
    the reconciler's configuration file: its tier graph is read now (``Graph.read``: a
    ``ConfigError`` is raised here), the whole of it at each hand resolution (its channels)."""
    csrf = os.urandom(16).hex()
    graph = data.Graph.read(config) if config else data.NOT_KNOWN
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.globals.update(iso=utc_iso, quote=lambda s: quote(str(s), safe=""), percent=percent,
                       ranges=list(RANGES), snoozes=list(SNOOZES), shade=_shade)

    def now_ms() -> int:
        return int(clock() * 1000)

    def store() -> Store:
        return Store(db, readonly=True)

    def since(request: Request) -> tuple[str, int]:
        name = request.query_params.get("range", DEFAULT_RANGE)
        if name not in RANGES:
            name = DEFAULT_RANGE
        return name, now_ms() - RANGES[name] * HOUR_MS

    def page(name: str, request: Request, **ctx) -> HTMLResponse:
        html = env.get_template(name).render(request=request, csrf=csrf, now_ms=now_ms(), **ctx)
        return HTMLResponse(html, headers=_SECURITY_HEADERS)

    def bad(message: str, status: int = 400) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    # -- pages ---------------------------------------------------------------------------
    def overview(request: Request):
        range_name, since_ms = since(request)
        with closing(store()) as s:
            tier = request.query_params.get("tier") or None
            page_no = _page(request)
            view = data.completeness(s, since_ms, tier, request.query_params.get("topic"),
                                     page_no, TOPICS_PER_PAGE, graph)
            open_alerts = data.alerts(s, "open", now_ms())
        measure = request.query_params.get("measure", DEFAULT_MEASURE)
        if measure not in MEASURES:
            measure = DEFAULT_MEASURE
        return page("overview.html", request, view=view, alerts=open_alerts,
                    range_name=range_name, measure=measure,
                    topic_filter=request.query_params.get("topic", ""))

    def topic_page(request: Request):
        range_name, since_ms = since(request)
        topic = request.path_params["topic"]
        with closing(store()) as s:
            hist = data.topic_history(s, topic, since_ms, graph)
        if not hist["windows"]:
            return page("missing.html", request, what=f"topic {topic}")
        return page("topic.html", request, hist=hist, range_name=range_name)

    def window_page(request: Request):
        topic = request.path_params["topic"]
        start = _window_start(request.path_params["start"])
        if start is None:
            return page("missing.html", request, what="that window")
        every = request.query_params.get("origins") == "all"
        with closing(store()) as s:
            detail = data.window_detail(s, topic, start, graph,
                                        None if every else data.SHOWN_ORIGINS)
        if detail is None:
            return page("missing.html", request, what=f"window {start} of {topic}")
        return page("window.html", request, w=detail, every=every)

    def alerts_page(request: Request):
        status = request.query_params.get("status", "open")
        if status not in ("open", "snoozed", "resolved", "all"):
            status = "open"
        with closing(store()) as s:
            rows = data.alerts(s, status, now_ms())
        return page("alerts.html", request, alerts=rows, status=status,
                    message=request.query_params.get("done", ""))

    async def alert_action(request: Request):
        form = await _form(request)
        if form is None:
            return bad("expected a form (application/x-www-form-urlencoded) under 10 KB")
        if not hmac.compare_digest(str(form.get("csrf", "")), csrf):
            return bad("missing or wrong CSRF token: reload the page", 403)
        try:
            alert_id = int(request.path_params["id"])
        except ValueError:
            return bad("no such alert", 404)
        action = request.path_params["action"]
        by = str(form.get("by") or "dashboard")[:100]
        s = Store(db)                  # the only writes: a snooze, a hand resolution
        try:
            if action == "snooze":
                hours = SNOOZES.get(str(form.get("for", "1h")))
                if hours is None:
                    return bad(f"snooze for one of {', '.join(SNOOZES)}")
                snooze(s, alert_id, now_ms() + hours * HOUR_MS, by, now_ms())
                done = f"alert {alert_id} snoozed for {form.get('for')}"
            elif action == "resolve":
                resolve_by_hand(s, rconfig.load(config) if config else rconfig.parse({}),
                                alert_id, by, now_ms())
                done = f"alert {alert_id} resolved"
            else:
                return bad("unknown action", 404)
        except LookupError:
            return bad(f"no alert {alert_id}", 404)
        finally:
            s.close()
        back = str(form.get("status") or "open")
        return RedirectResponse("/alerts?" + urlencode({"status": back, "done": done}),
                                status_code=303)

    def health_page(request: Request):
        with closing(store()) as s:
            rows = data.health(s, now_ms(), graph)
            hosts = data.producers(s, now_ms())
        return page("health.html", request, tiers=rows, producers=hosts, now=now_ms())

    # -- API -----------------------------------------------------------------------------
    def api_completeness(request: Request):
        _name, since_ms = since(request)
        with closing(store()) as s:
            per_page = request.query_params.get("per_page", "0")
            return JSONResponse(data.completeness(
                s, since_ms, request.query_params.get("tier"), request.query_params.get("topic"),
                _page(request), int(per_page) if per_page.isdigit() else 0, graph))

    def api_tiers(request: Request):
        with closing(store()) as s:
            return JSONResponse(data.tiers(s, graph))

    def api_alerts(request: Request):
        status = request.query_params.get("status", "open")
        if status not in ("open", "snoozed", "resolved", "all"):
            return bad("status is one of open, snoozed, resolved, all")
        with closing(store()) as s:
            return JSONResponse({"alerts": data.alerts(s, status, now_ms())})

    def api_watermark(request: Request):
        topic, tier = request.query_params.get("topic"), request.query_params.get("tier")
        if not topic or not tier:
            return bad("give topic and tier")
        with closing(store()) as s:
            mark = watermark(s, topic, tier)
        return JSONResponse({"topic": topic, "tier": tier, "watermark_ms": mark,
                             "watermark": None if mark is None else utc_iso(mark)})

    def api_window(request: Request):
        topic = request.query_params.get("topic")
        start = _window_start(request.query_params.get("start", ""))
        if not topic or start is None:
            return bad("give topic and start (window start, ms)")
        with closing(store()) as s:
            detail = data.window_detail(s, topic, start, graph)
        return JSONResponse(detail) if detail else bad("no such window", 404)

    def api_topic(request: Request):
        _name, since_ms = since(request)
        topic = request.query_params.get("topic")
        if not topic:
            return bad("give topic")
        with closing(store()) as s:
            return JSONResponse(data.topic_history(s, topic, since_ms, graph))

    def api_health(request: Request):
        with closing(store()) as s:
            return JSONResponse({"tiers": data.health(s, now_ms(), graph),
                                 "producers": data.producers(s, now_ms())})

    routes = [
        Route("/", overview), Route("/topic/{topic:path}", topic_page),
        Route("/window/{topic}/{start}", window_page), Route("/alerts", alerts_page),
        Route("/alerts/{id}/{action}", alert_action, methods=["POST"]),
        Route("/health", health_page),
        Route("/api/completeness", api_completeness), Route("/api/tiers", api_tiers),
        Route("/api/alerts", api_alerts), Route("/api/watermark", api_watermark),
        Route("/api/window", api_window), Route("/api/topic", api_topic),
        Route("/api/health", api_health),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={StoreMissing: _no_database})
    if token:
        app.add_middleware(_TokenAuth, token=token)
    else:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts or LOOPBACK_HOSTS)
    return app


def _page(request: Request) -> int:
    text = request.query_params.get("page", "0")
    return min(int(text), 10**6) if text.isdigit() else 0


def _window_start(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) <= 15 else None


async def _form(request: Request) -> dict[str, str] | None:
    """A small urlencoded form (the pages' snooze and resolve), without a multipart parser."""
    if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"):
        return None
    body = await request.body()
    if len(body) > 10_000:
        return None
    try:
        return {k: v[0] for k, v in parse_qs(body.decode(), max_num_fields=20).items()}
    except (UnicodeDecodeError, ValueError):
        return None


async def _no_database(request: Request, exc: StoreMissing):
    return JSONResponse({"error": str(exc), "hint": exc.hint}, status_code=503)


_SECURITY_HEADERS = {
    # Nothing but this server: no CDN, no inline script, no framing.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _TokenAuth:
    """Every request carries the token: as a bearer token, or as the basic-auth password."""

    def __init__(self, app, token: str):
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope, receive, send):
        # Only the server's own lifespan events pass without it; HTTP and WebSocket need it.
        if scope["type"] == "lifespan" or self._allowed(dict(scope.get("headers") or [])):
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            return await send({"type": "websocket.close", "code": 1008})
        response = Response("a token is needed: Authorization: Bearer TOKEN, or basic auth "
                            "with it as the password\n", status_code=401,
                            headers={"WWW-Authenticate": 'Basic realm="docket"'})
        await response(scope, receive, send)

    def _allowed(self, headers: dict) -> bool:
        auth = headers.get(b"authorization", b"")
        scheme, _, value = auth.partition(b" ")
        if scheme.lower() == b"bearer":
            return hmac.compare_digest(value.strip(), self.token)
        if scheme.lower() == b"basic":
            try:
                _user, _, password = base64.b64decode(value.strip()).partition(b":")
            except ValueError:
                return False
            return hmac.compare_digest(password, self.token)
        return False


def _shade(cell: dict, measure: str) -> str:
    """The colour of a tier's cell (overview, topic page): its state, which for a tier fed by
    other tiers is the verdict on its hop; end to end, such a tier complete at its hop but
    short of what the producers accepted is ``upstream`` (lost before its hop,
    docs/topology.md)."""
    whole = cell["completeness"]
    if measure == "end_to_end" and cell["state"] == "complete" and whole is not None \
            and whole < 1:
        return "upstream"
    return cell["state"]
