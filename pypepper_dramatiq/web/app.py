"""The dashboard's WSGI application: routing, access, actions, and rendering.

Werkzeug routes and wraps the requests, Jinja2 renders the pages (autoescaped),
itsdangerous signs the forms' CSRF tokens (:mod:`.security`). The pages read the
job store; the actions go through the package's own calls (``Job.cancel_saved``,
``Job.retry_saved``, :mod:`~pypepper_dramatiq.schedules.firing`), as the shell does.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import Map, MapAdapter, PathConverter, RequestRedirect, Rule
from werkzeug.utils import redirect, send_from_directory
from werkzeug.wrappers import Request, Response

from ..channels.broker import get_broker, transport_of
from ..channels.channel import manager
from ..engine.pausing import pause_in, resume_in
from ..errors import (
    BrokerUnavailableError,
    ChannelEnqueueError,
    CorruptRecordError,
    InvalidTransitionError,
    PausingUnsupportedError,
    RetryError,
    StoreError,
    UnknownChannelError,
    UnknownExecutorError,
    UnknownJobError,
    UnknownScheduleError,
)
from ..limits.storable import unstorable_in
from ..model.job import Job
from ..ops.logs import get_logger
from ..records.job_filter import JobFilter
from ..records.paging import decode_cursor, encode_cursor
from ..records.pauses import CHANNEL, TASK
from ..records.record import MAX_ID_LENGTH, utcnow
from ..records.state import by_dashboard
from ..records.workers import GONE_AFTER_BEATS, HEARTBEAT_SECONDS
from ..rules.status import Status
from ..schedules.firing import pause_recurring, resume_recurring, trigger_recurring
from ..stores.base import IJobStore
from ..stores.registry import get_job_store
from . import bulk, charts, text, views
from .security import CSRF_COOKIE, CSRF_FIELD, REALM, Auth, CsrfTokens, same_origin

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

logger = get_logger(__name__)

HERE = Path(__file__).parent

#: What a 409 says when a job cannot be rebuilt here: its tasks' code is not imported.
REBUILD_HINT = (
    "This dashboard process has not imported the code of its tasks: serve it with "
    "'pypepper-dramatiq dashboard --import MODULE' (or $PYPEPPER_IMPORT), or call "
    "make_app() in a process that imports them."
)
#: Jobs per page unless ``limit`` says otherwise, and the most it may say.
PAGE, MOST = 50, 500
#: The counts per status are exact up to this many jobs, "more than" above it.
COUNTED = 10_000
#: The longest text search taken (characters; the rest is dropped).
SEARCH_LONGEST = 200
#: How many jobs one page of a text search looks through, newest first: no index
#: serves a substring of an error, so a search reads a window of rows (by the
#: (status, created, id) indexes) and offers to search the next window.
SEARCH_WINDOW = 20_000
#: The farthest a page of a job's parents or children may start (the children up to
#: it are read to reach it).
LINKED_FARTHEST = 1_000_000

#: The notices an action's redirect may name (``?notice=``): fixed words, never echoed input.
NOTICES = {
    "cancelled": "The job was cancelled.",
    "ended": "The job had already ended: nothing was cancelled.",
    "busy": "The row kept changing while the action ran; nothing was changed. Try again.",
    "paused": "The schedule is paused.",
    "resumed": "The schedule is resumed; it fires next at its next slot.",
    "triggered": "The schedule was fired now: this is the job in charge.",
    "retried": "This job retries the one it was made from, where that one stopped: the "
    "tasks before it kept their results.",
    "channel_stopped": "The channel is stopped: new jobs are refused until it is resumed; "
    "jobs already queued still run.",
    "channel_resumed": "The channel is resumed: it takes new jobs again.",
    "channel_resized": "The channel's bound is changed.",
    "channel_unchanged": "The channel already had that bound: nothing was changed.",
    "channel_paused": "The channel is paused: it takes new jobs, and none starts until it "
    "is unpaused; steps running now finish.",
    "channel_unpaused": "The channel is unpaused: the jobs held meanwhile start, oldest first.",
    "task_paused": "The task type is paused: its jobs are taken, and none of its steps "
    "starts until it is unpaused; steps running now finish.",
    "task_unpaused": "The task type is unpaused: its steps held meanwhile start, oldest first.",
    "not_paused": "It was not paused: nothing was changed.",
    "already_paused": "It was paused already: nothing was changed.",
}

#: The largest bound the channels page sets (more is a typo; 0 is unbounded).
LARGEST_BOUND = 1_000_000_000

#: The dashboard's icon (static/), also served at /favicon.ico.
FAVICON = "favicon.svg"

#: What a page that failed unexpectedly says (the log has the traceback).
SERVER_ERROR = "The dashboard failed on this page; the server's log says why."

#: Sent with every page: no script or style from elsewhere, no framing, no caching.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _the_list(urls: MapAdapter, **_: Any) -> str:
    """Where ``/jobs`` leads: the jobs list, with the query the request had."""
    query = urls.encode_query_args(urls.query_args or "")
    return urls.build("jobs", force_external=True) + (f"?{query}" if query else "")


class _AnyText(PathConverter):
    """A job id or schedule name as the last part of a path: any text, slashes included,
    even a leading, trailing or doubled one (``/ops/nightly``, ``a//b``)."""

    regex = ".+"
    part_isolating = False  # Werkzeug would infer True: the pattern names no "/"


_URLS = Map(
    [
        Rule("/", endpoint="jobs"),
        # Where a list of jobs would be: the list (an answer of Werkzeug's RequestRedirect).
        Rule("/jobs", redirect_to=_the_list),
        Rule("/jobs/<text:job_id>", endpoint="job"),
        # The list after the first views.LISTED of a job's parents or children.
        Rule("/linked/<any(parents, children):kind>/<text:job_id>", endpoint="linked"),
        Rule("/schedules", endpoint="schedules"),
        # Actions first, the name last: a job id or schedule name may hold a "/".
        # GET: the confirmation page, whose form POSTs here (no JavaScript needed).
        Rule("/actions/cancel/<text:job_id>", endpoint="cancel", methods=["GET", "POST"]),
        Rule("/actions/retry/<text:job_id>", endpoint="retry", methods=["POST"]),
        # GET: the confirmation page of a bulk action (a filter or a selection); its
        # form POSTs the ids it shows here.
        Rule("/actions/bulk/<any(retry, cancel):action>", endpoint="bulk", methods=["GET", "POST"]),
        Rule("/actions/pause/<text:name>", endpoint="pause", methods=["POST"]),
        Rule("/actions/resume/<text:name>", endpoint="resume", methods=["POST"]),
        Rule("/actions/trigger/<text:name>", endpoint="trigger", methods=["POST"]),
        Rule("/channels", endpoint="channels"),
        Rule(
            "/actions/channel/<any(stop, resume, resize):action>/<text:name>",
            endpoint="channel_action",
            methods=["POST"],
        ),
        # The name in the form: a task type's is typed into one.
        Rule(
            "/actions/paused/<any(channel, task):kind>/<any(pause, resume):action>",
            endpoint="pause_action",
            methods=["POST"],
        ),
        Rule("/workers", endpoint="workers"),
        Rule("/charts", endpoint="charts"),
        Rule("/static/<path:filename>", endpoint="static"),
        # Where a browser looks for the icon of a page that names none.
        Rule("/favicon.ico", endpoint="favicon"),
    ],
    strict_slashes=False,
    # "//" is kept: merged, "/jobs//x" would be the job "x", not "/x" (and a POST to
    # pause "/ops/nightly" would be redirected to pause "ops/nightly").
    merge_slashes=False,
    converters={"text": _AnyText},
)


class Refused(HTTPException):
    """An action the dashboard will not do, with the reason shown on the page."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(description)
        self.code = code


@dataclass
class _Call:
    """One request as the handlers see it."""

    request: Request
    urls: MapAdapter
    csrf_value: str
    new_csrf_value: bool

    def url(self, endpoint: str, **values: Any) -> str:
        return self.urls.build(endpoint, {k: v for k, v in values.items() if v not in (None, "")})


class Dashboard:
    """The WSGI application :func:`make_app` returns (see there)."""

    #: How many jobs one page of a text search looks through (:data:`SEARCH_WINDOW`).
    search_window = SEARCH_WINDOW

    def __init__(
        self,
        store: IJobStore | None = None,
        broker: Any | None = None,
        *,
        auth: Auth | None = None,
        allow_anonymous_actions: bool = False,
        secret_key: str | bytes | None = None,
    ) -> None:
        if auth is not None and not callable(auth):
            raise TypeError(f"auth must be a callable taking the WSGI environ, got {auth!r}")
        self._store = store
        self._broker = broker
        self.auth = auth
        #: Whether the forms act: with an ``auth``, or when anonymous actions are allowed.
        self.actions_allowed = auth is not None or bool(allow_anonymous_actions)
        self._csrf = CsrfTokens(secret_key if secret_key else secrets.token_bytes(32))
        self._templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=text.shown,  # every printed text: controls, bidi, zero-width made visible
        )
        self._templates.filters.update(block=text.block, verbatim=text.verbatim, field=text.field)

    # -- WSGI ---------------------------------------------------------------------------

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        try:
            response = self._respond(request)
        except Exception:  # the error page itself failed (a template, the auth callable)
            logger.exception("dashboard: %s %s failed", request.method, request.path)
            response = Response(f"500 {SERVER_ERROR}\n", 500, mimetype="text/plain")
            response.headers.extend(SECURITY_HEADERS)
        return response(environ, start_response)

    @property
    def store(self) -> IJobStore:
        """The store the pages read: the one given, else the process's."""
        return self._store if self._store is not None else get_job_store()

    def _respond(self, request: Request) -> Response:
        # Exactly True: a truthy answer by mistake (a user name, a dict) keeps it out.
        if self.auth is not None and self.auth(request.environ) is not True:
            return Response(
                "Authentication required.\n",
                401,
                {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"', **SECURITY_HEADERS},
                mimetype="text/plain",
            )
        value = request.cookies.get(CSRF_COOKIE) or ""
        fresh = not (20 <= len(value) <= 100)
        call = _Call(
            request,
            _URLS.bind_to_environ(request.environ),
            CsrfTokens.new_value() if fresh else value,
            fresh,
        )
        try:
            endpoint, values = call.urls.match()
            response: Response = getattr(self, f"_{endpoint}")(call, **values)
        except RequestRedirect as exc:  # Werkzeug's own redirect: answered as one
            response = exc.get_response(request.environ)
        except MethodNotAllowed as exc:
            response = self._error(call, 405, "This address takes a POST form, not a visit.")
            response.headers["Allow"] = ", ".join(exc.valid_methods or ())
        except HTTPException as exc:
            response = self._error(call, exc.code or 500, exc.description or "")
        except CorruptRecordError as exc:
            # An action on a row that cannot be read (its page shows what can be).
            response = self._error(call, 409, f"{exc}. Nothing was changed.")
        except StoreError as exc:
            logger.warning("dashboard: the job store cannot be used: %s", exc)
            response = self._error(call, 503, f"The job store cannot be used: {exc}")
        except Exception:
            logger.exception("dashboard: %s %s failed", request.method, request.path)
            response = self._error(call, 500, SERVER_ERROR)
        for name, header in SECURITY_HEADERS.items():
            response.headers.setdefault(name, header)
        if call.new_csrf_value:
            response.set_cookie(
                CSRF_COOKIE,
                call.csrf_value,
                path=(request.script_root or "") + "/",
                httponly=True,
                samesite="Strict",
                secure=request.is_secure,
            )
        return response

    # -- rendering ----------------------------------------------------------------------

    def _render(self, call: _Call, template: str, status: int = 200, **values: Any) -> Response:
        notice = NOTICES.get(call.request.args.get("notice", ""))
        page = self._templates.get_template(template).render(
            url=call.url,
            csrf_field=CSRF_FIELD,
            csrf_token=self._csrf.token(call.csrf_value),
            actions_allowed=self.actions_allowed,
            anonymous_actions=self.actions_allowed and self.auth is None,
            notice=notice,
            request_path=call.request.path,
            **values,
        )
        return Response(page, status, mimetype="text/html")

    def _error(self, call: _Call, code: int, message: str) -> Response:
        titles = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found"}
        titles |= {405: "Method not allowed", 409: "Conflict", 503: "Store unavailable"}
        titles |= {500: "Server error"}
        return self._render(
            call, "error.html", code, code=code, title=titles.get(code, "Error"), message=message
        )

    # -- pages --------------------------------------------------------------------------

    def _jobs(self, call: _Call) -> Response:
        args = call.request.args
        status = _listed_status(args)
        wanted = replace(_job_filter(args), status=status)
        search = (args.get("q") or "").strip()[:SEARCH_LONGEST] or None
        limit = _limit(args.get("limit"))
        before = None
        if args.get("before"):
            before = decode_cursor(args["before"])
            if before is None:
                raise Refused(400, "The page cursor is not one this dashboard made.")
        filters = {
            "status": args.get("status") or None,
            "channel": wanted.channel_id,
            "category": wanted.category,
            "q": search,
            "created_from": args.get("created_from") if wanted.created_from else None,
            "created_until": args.get("created_until") if wanted.created_until else None,
        }
        search_more = None
        texts = (wanted.channel_id, wanted.category, search)
        if any(unstorable_in(value or "") for value in texts):
            # No stored value holds a NUL or a lone surrogate (no store keeps them): nothing
            # matches, and the store is not asked (PostgreSQL would refuse the query).
            found: list[Any] = []
            counts = dict.fromkeys(Status, 0)
        else:
            beyond = None
            if search is not None:
                # The window's last row and the one after it: the search reads the
                # rows newer than that one, and goes on from the last.
                edge = self.store.list_keys(
                    replace(wanted, before=before),
                    offset=self.search_window - 1,
                    limit=2,
                    newest_first=True,
                )
                if len(edge) == 2:
                    window_end, beyond = edge
            found = list(
                self.store.list_matching(
                    replace(wanted, search=search, before=before, after=beyond),
                    limit=limit + 1,
                    newest_first=True,
                )
            )
            if beyond is not None and len(found) <= limit:
                search_more = encode_cursor(*window_end)
            counts = self.store.count_by_status(replace(wanted, status=None), limit=COUNTED)
        page = found[:limit]
        retries = views.retries_of(page, self.store)
        older = encode_cursor(page[-1].created, page[-1].id) if len(found) > limit else None
        return self._render(
            call,
            "jobs.html",
            rows=[views.job_row(record, retries.get(record.id, ())) for record in page],
            counts=[
                (s.value, views.count_text([counts.get(s, 0)], COUNTED))
                for s in views.STORED_STATUSES
            ],
            total=views.count_text(counts.values(), COUNTED),
            filters=filters,
            statuses=[s.value for s in views.STORED_STATUSES],
            limit=limit,
            limit_given=args.get("limit"),
            older=older,
            search_more=search_more,
            search_window=f"{self.search_window:,}",
            paged=before is not None,
        )

    def _job(self, call: _Call, job_id: str) -> Response:
        try:
            record = self.store.get(job_id) if _plausible_id(job_id) else None
        except CorruptRecordError:
            # The listing's read answers what could be read of the row.
            record = next(iter(self.store.get_many([job_id])), None)
        if record is None:
            raise Refused(404, f"No job {job_id!r} is stored.")
        if record.damaged is not None:
            return self._render(call, "damaged.html", job=views.damaged_view(record))
        return self._render(call, "job.html", job=views.job_view(record, self.store))

    def _linked(self, call: _Call, kind: str, job_id: str) -> Response:
        record = self.store.get(job_id) if _plausible_id(job_id) else None
        if record is None:
            raise Refused(404, f"No job {job_id!r} is stored.")
        start = _start(call.request.args.get("start"))
        page = views.linked_page(record, self.store, kind, start)
        return self._render(call, "linked.html", page=page)

    def _schedules(self, call: _Call) -> Response:
        rows = views.schedule_rows(self.store.list_recurring(), self.store)
        return self._render(call, "schedules.html", schedules=rows)

    def _channels(self, call: _Call) -> Response:
        broker = self._broker if self._broker is not None else get_broker()
        problem = None
        try:
            source, rows = views.channel_rows(
                broker, [c for c in map(manager.get, manager.ids()) if c is not None]
            )
        except Exception as exc:  # the server down: the page says so rather than failing
            source = transport_of(broker).where
            rows, problem = [], f"{source} cannot be read: {exc}"
        paused = self.store.paused()
        channels = {name for kind, name in paused if kind == CHANNEL}
        rows = [replace(row, paused=row.name in channels) for row in rows]
        return self._render(
            call,
            "channels.html",
            source=source,
            channels=rows,
            problem=problem,
            paused_tasks=sorted(name for kind, name in paused if kind == TASK),
        )

    def _lists_channel(self, name: str) -> bool:
        """Whether the Channels page lists channel ``name`` (the shared transport of the
        page's broker holds its state), so that it may be paused from there."""
        broker = self._broker if self._broker is not None else get_broker()
        try:
            return transport_of(broker).shared and manager.gate_of(name, broker).known()
        except Exception:  # the transport is down: the store decides (a job uses it)
            return False

    def _pause_action(self, call: _Call, kind: str, action: str) -> Response:
        """Pause or unpause a channel or a task type (its name in the form's ``name``),
        for every process, in the job store (:mod:`~pypepper_dramatiq.engine.pausing`)."""
        self._may_act(call)
        name = (call.request.form.get("name") or "").strip()
        if not _plausible_name(name):
            raise Refused(400, f"No {kind} was named.")
        by = by_dashboard(_user_of(call.request))
        try:
            if action == "pause":
                listed = kind == CHANNEL and self._lists_channel(name)
                changed = pause_in(self.store, kind, name, known=listed)
            else:
                changed = resume_in(self.store, kind, name)
        except (UnknownChannelError, UnknownExecutorError) as exc:
            hint = f" {REBUILD_HINT}" if kind == TASK else ""
            raise Refused(404, f"{exc}.{hint} Nothing was changed.") from None
        except PausingUnsupportedError as exc:
            raise Refused(501, str(exc)) from None
        except ValueError as exc:
            raise Refused(400, f"{exc}. Nothing was changed.") from None
        done = "paused" if action == "pause" else "unpaused"
        if changed:
            notice = f"{kind}_{done}"
        else:
            notice = "already_paused" if action == "pause" else "not_paused"
        logger.info(
            "dashboard: %s %s %s by %s%s",
            kind,
            name,
            done,
            by,
            "" if changed else " (no change)",
            extra={"action": f"dashboard_{kind}_{action}", "paused": name, "by": by},
        )
        return redirect(call.url("channels", notice=notice), 303)

    def _channel_action(self, call: _Call, action: str, name: str) -> Response:
        """Stop, resume or resize channel ``name`` as ``pypepper-dramatiq channels`` does:
        on its gate, shared by every process through the transport (Redis)."""
        self._may_act(call)
        size = _bound(call.request.form.get("size")) if action == "resize" else None
        broker = self._broker if self._broker is not None else get_broker()
        shared = transport_of(broker).shared
        if not _plausible_name(name) or (not shared and manager.get(name) is None):
            # Without a shared transport only this process's channels are there to change.
            raise Refused(404, f"No channel {name!r} is known here.")
        by = by_dashboard(_user_of(call.request))
        try:
            gate = manager.gate_of(name, broker)
            if action == "resume" and not gate.known():
                raise Refused(404, f"No channel {name!r} is known: there is no stop to lift.")
            if action == "stop":
                gate.request_stop()
                notice, before = "channel_stopped", None
            elif action == "resume":
                gate.resume()
                notice, before = "channel_resumed", None
            else:
                assert size is not None
                before = gate.resize(size)
                notice = "channel_resized" if before != size else "channel_unchanged"
        except BrokerUnavailableError as exc:
            raise Refused(503, f"The channel was not changed: {exc}") from None
        logger.info(
            "dashboard: channel %s %s by %s%s",
            name,
            {"stop": "stopped", "resume": "resumed", "resize": "resized"}[action],
            by,
            "" if size is None else f": bound {before} -> {size}",
            extra={"action": f"dashboard_channel_{action}", "channel_id": name, "by": by},
        )
        return redirect(call.url("channels", notice=notice), 303)

    def _charts(self, call: _Call) -> Response:
        name = call.request.args.get("range") or "hour"
        if name not in charts.CHART_RANGES:
            raise Refused(400, f"The range must be one of {', '.join(charts.CHART_RANGES)}.")
        found = charts.read_charts(self.store, name, utcnow())
        return self._render(
            call,
            "charts.html",
            chart=found.ended,
            charts=found,
            ranges=list(charts.CHART_RANGES),
            live=True,
        )

    def _workers(self, call: _Call) -> Response:
        now = utcnow()
        found = self.store.workers(now)
        rows = views.worker_rows(self.store, now, found)
        return self._render(
            call,
            "workers.html",
            workers=rows,
            sweep=views.sweep_row(found, now),
            gone_after=GONE_AFTER_BEATS,
            heartbeat=HEARTBEAT_SECONDS,
        )

    def _static(self, call: _Call, filename: str) -> Response:
        return send_from_directory(HERE / "static", filename, call.request.environ)

    def _favicon(self, call: _Call) -> Response:
        return send_from_directory(HERE / "static", FAVICON, call.request.environ)

    # -- actions ------------------------------------------------------------------------

    def _may_act(self, call: _Call) -> None:
        """Refuse the action unless it is allowed, comes from a page of this site, carries
        a good token, and acts on the store the pages show."""
        if not self.actions_allowed:
            raise Refused(
                403,
                "This dashboard is read-only: it has no authentication configured "
                "(make_app(auth=...), or allow_anonymous_actions=True).",
            )
        if not _from_this_site(call.request):
            raise Refused(
                403,
                "The form was sent from a page of another site (its Origin or Referer "
                "names another host): nothing was done.",
            )
        token = call.request.form.get(CSRF_FIELD)
        if call.new_csrf_value or not self._csrf.valid(token, call.csrf_value):
            raise Refused(403, "The form's CSRF token is missing or not valid: reload the page.")
        if self._store is not None and self._store is not get_job_store():
            raise Refused(
                409,
                "Actions go through the process's job store, and this dashboard shows "
                "another one: install it with set_job_store(store) to act on it.",
            )

    def _cancel(self, call: _Call, job_id: str) -> Response:
        if call.request.method != "POST":
            return self._confirm_cancel(call, job_id)
        self._may_act(call)
        if not _plausible_id(job_id):
            raise Refused(404, f"No job {job_id!r} is stored.")
        by = by_dashboard(_user_of(call.request))
        try:
            notice = "cancelled" if Job.cancel_saved(job_id, by=by) else "busy"
        except UnknownJobError:
            raise Refused(404, f"No job {job_id!r} is stored.") from None
        except InvalidTransitionError:
            notice = "ended"
        logger.info(
            "dashboard: cancel of job %s by %s: %s",
            job_id,
            by,
            notice,
            extra={"action": "dashboard_cancel", "job_id": job_id, "by": by},
        )
        return redirect(call.url("job", job_id=job_id, notice=notice), 303)

    def _confirm_cancel(self, call: _Call, job_id: str) -> Response:
        """The page that asks before a cancel: the job's page's Cancel button leads
        here, and its form sends the POST that cancels."""
        if not self.actions_allowed:
            self._may_act(call)  # refused: read-only
        record = self.store.get(job_id) if _plausible_id(job_id) else None
        if record is None:
            raise Refused(404, f"No job {job_id!r} is stored.")
        if record.status not in views.CANCELLABLE:
            return redirect(call.url("job", job_id=job_id, notice="ended"), 303)
        return self._render(call, "confirm_cancel.html", record=record)

    def _retry(self, call: _Call, job_id: str) -> Response:
        self._may_act(call)
        if not _plausible_id(job_id):
            raise Refused(404, f"No job {job_id!r} is stored.")
        try:
            new_id = Job.retry_saved(job_id)
        except UnknownJobError:
            raise Refused(404, f"No job {job_id!r} is stored.") from None
        except UnknownExecutorError as exc:
            raise Refused(409, f"The job was not retried: {exc}. {REBUILD_HINT}") from None
        except (RetryError, ChannelEnqueueError) as exc:
            raise Refused(409, f"The job was not retried: {exc}") from None
        logger.info(
            "dashboard: job %s retried by job %s",
            job_id,
            new_id,
            extra={"action": "dashboard_retry", "job_id": job_id, "retried_by": new_id},
        )
        return redirect(call.url("job", job_id=new_id, notice="retried"), 303)

    def _bulk(self, call: _Call, action: str) -> Response:
        chosen_action = bulk.BULK_ACTIONS[action]
        if call.request.method != "POST":
            return self._confirm_bulk(call, chosen_action)
        self._may_act(call)
        job_ids = _bulk_ids(call.request.form.getlist("ids"))
        if not job_ids:
            raise Refused(400, "The form names no job: nothing was done.")
        chosen = bulk.bulk_by_ids(self.store, chosen_action, job_ids)
        by = by_dashboard(_user_of(call.request))
        outcomes = [self._bulk_one(chosen_action, record.id, by) for record in chosen.records]
        logger.info(
            "dashboard: bulk %s by %s: %d of %d jobs asked (%s)",
            action,
            by,
            sum(outcome.done for outcome in outcomes),
            len(job_ids),
            ", ".join(f"{o.job_id}: {o.what}" for o in outcomes) or "none taken",
            extra={"action": f"dashboard_bulk_{action}", "by": by, "jobs": len(outcomes)},
        )
        return self._render(
            call,
            "bulk_done.html",
            action=chosen_action,
            outcomes=outcomes,
            done=sum(outcome.done for outcome in outcomes),
            left_out=chosen.left_out,
        )

    def _bulk_one(self, action: bulk.BulkAction, job_id: str, by: str) -> _Outcome:
        """Retry or cancel one job of a bulk action; what came of it."""
        if action.name == "cancel":
            try:
                cancelled = Job.cancel_saved(job_id, by=by)
            except UnknownJobError:
                return _Outcome(job_id, False, "no longer stored")
            except InvalidTransitionError:
                return _Outcome(job_id, False, "had already ended")
            return _Outcome(job_id, cancelled, "cancelled" if cancelled else "busy: not changed")
        try:
            new_id = Job.retry_saved(job_id)
        except UnknownJobError:
            return _Outcome(job_id, False, "no longer stored")
        except UnknownExecutorError as exc:
            return _Outcome(job_id, False, f"not retried: {exc}. {REBUILD_HINT}")
        except (RetryError, ChannelEnqueueError) as exc:
            return _Outcome(job_id, False, f"not retried: {exc}")
        return _Outcome(job_id, True, "retried", new_id)

    def _confirm_bulk(self, call: _Call, action: bulk.BulkAction) -> Response:
        """The page that shows which jobs a bulk action touches and asks to confirm."""
        if not self.actions_allowed:
            self._may_act(call)  # refused: read-only
        args = call.request.args
        if args.get("q"):
            raise Refused(
                400,
                "A bulk action takes the list's filters but its text search: select the "
                "jobs found instead.",
            )
        if "ids" in args:
            chosen = bulk.bulk_by_ids(self.store, action, _bulk_ids(args.getlist("ids")))
        else:
            chosen = bulk.bulk_by_filter(self.store, action, _job_filter(args))
        return self._render(
            call,
            "confirm_bulk.html",
            action=action,
            rows=[views.job_row(record) for record in chosen.records],
            more=chosen.more,
            left_out=chosen.left_out,
            most=bulk.BULK_MOST,
            scan=f"{bulk.BULK_SCAN:,}",
        )

    def _pause(self, call: _Call, name: str) -> Response:
        return self._schedule_action(call, name, "paused")

    def _resume(self, call: _Call, name: str) -> Response:
        return self._schedule_action(call, name, "resumed")

    def _trigger(self, call: _Call, name: str) -> Response:
        self._may_act(call)
        if not _plausible_name(name):
            raise Refused(404, f"No recurring schedule {name!r} is stored.")
        try:
            job_id = trigger_recurring(name)
        except UnknownScheduleError:
            raise Refused(404, f"No recurring schedule {name!r} is stored.") from None
        except UnknownExecutorError as exc:
            raise Refused(409, f"The schedule was not fired: {exc}. {REBUILD_HINT}") from None
        except ChannelEnqueueError as exc:
            raise Refused(409, f"The schedule was not fired: {exc}") from None
        return redirect(call.url("job", job_id=job_id, notice="triggered"), 303)

    def _schedule_action(self, call: _Call, name: str, done: str) -> Response:
        self._may_act(call)
        change = pause_recurring if done == "paused" else resume_recurring
        if not _plausible_name(name):
            raise Refused(404, f"No recurring schedule {name!r} is stored.")
        try:
            notice = done if change(name) else "busy"
        except UnknownScheduleError:
            raise Refused(404, f"No recurring schedule {name!r} is stored.") from None
        return redirect(call.url("schedules", notice=notice), 303)


@dataclass(frozen=True)
class _Outcome:
    """What a bulk action did to one job."""

    job_id: str
    done: bool
    what: str
    new_id: str | None = None


def _bulk_ids(given: list[str]) -> list[str]:
    """The job ids of a bulk form, each a plausible id, at most :data:`bulk.BULK_MOST`."""
    job_ids = [job_id for job_id in dict.fromkeys(given) if job_id]
    if len(job_ids) > bulk.BULK_MOST:
        raise Refused(400, f"A bulk action takes at most {bulk.BULK_MOST} jobs at a time.")
    return [job_id for job_id in job_ids if _plausible_id(job_id)]


def _user_of(request: Request) -> str | None:
    """Who sends the request, as the dashboard knows it: the basic-auth user name,
    else the server's ``REMOTE_USER``; None when anonymous."""
    auth = request.authorization
    if auth is not None and auth.username:
        return auth.username
    return request.remote_user or None


def _from_this_site(request: Request) -> bool:
    """Whether an action's POST comes from a page of this dashboard (:func:`same_origin`):
    its host as the request names it, or as a proxy in front forwarded it."""
    hosts = [request.host, *request.headers.get("X-Forwarded-Host", "").split(",")]
    headers = request.headers
    return same_origin([h for h in hosts if h], headers.get("Origin"), headers.get("Referer"))


def _plausible_id(job_id: str) -> bool:
    """Whether a store could hold ``job_id`` (a longer one, or one with a code point no
    store keeps, cannot be stored: it is no job, and the store is not asked)."""
    return 0 < len(job_id) <= MAX_ID_LENGTH and unstorable_in(job_id) is None


def _plausible_name(name: str) -> bool:
    """Whether a store could hold a recurring schedule named ``name``."""
    return bool(name) and unstorable_in(name) is None


def _bound(text: str | None) -> int:
    """A channel's new bound from the resize form: a whole number, 0 for unbounded."""
    try:
        value = int((text or "").strip())
    except ValueError:
        value = -1
    if not 0 <= value <= LARGEST_BOUND:
        raise Refused(
            400, f"The bound must be a whole number from 0 (unbounded) to {LARGEST_BOUND:,}."
        )
    return value


def _limit(text: str | None) -> int:
    if not text:
        return PAGE
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MOST:
        raise Refused(400, f"The page size must be a whole number from 1 to {MOST}.")
    return value


def _start(text: str | None) -> int:
    """Where a page of linked jobs starts: a whole number, 0 for none."""
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= LINKED_FARTHEST:
        raise Refused(400, f"start must be a whole number from 0 to {LINKED_FARTHEST:,}.")
    return value


def _listed_status(args: Mapping[str, str]) -> Status | None:
    """The jobs page's status filter: a status a stored job has, else a 400 page."""
    status = args.get("status") or None
    if status is not None and status not in {s.value for s in views.STORED_STATUSES}:
        raise Refused(400, "Unknown status in the filter.")
    return None if status is None else Status(status)


def _job_filter(args: Mapping[str, str]) -> JobFilter:
    """The filters the jobs page and its bulk actions share, read from the query:
    channel, category and created range (a time that is none is a 400 page)."""
    return JobFilter(
        channel_id=args.get("channel") or None,
        category=args.get("category") or None,
        created_from=_moment(args.get("created_from"), "created_from"),
        created_until=_moment(args.get("created_until"), "created_until"),
    )


def _moment(text: str | None, name: str) -> datetime | None:
    """A time filter from a form: ISO 8601 (a date, or ``datetime-local``'s
    ``YYYY-MM-DDTHH:MM``); without an offset it is UTC."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Refused(
            400, f"{name} must be a date or a time such as 2026-11-30T08:00 (UTC)."
        ) from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def make_app(
    store: IJobStore | None = None,
    broker: Any | None = None,
    *,
    auth: Auth | None = None,
    allow_anonymous_actions: bool = False,
    secret_key: str | bytes | None = None,
) -> Dashboard:
    """The dashboard as a WSGI application, to serve alone or mount under a prefix.

    Args:
        store: the job store the pages show; default: the process's
            (:func:`~pypepper_dramatiq.get_job_store`, looked up per request).
            The actions act on the process's store through the package's calls;
            with another store given here they are refused (409).
        broker: the Dramatiq broker whose Redis holds the channels (the channels
            page); default: the process's. With a broker that is not Redis, the
            page shows this process's channels.
        auth: ``auth(environ) -> bool`` decides each request: ``True`` (exactly that
            bool) lets it in; anything else (False, None, a truthy value such as a user
            name) answers 401 with a basic-auth challenge
            (:func:`~pypepper_dramatiq.web.basic_auth` makes one). Without it the
            dashboard is read-only...
        allow_anonymous_actions: ...unless this is True: anyone who reaches it may
            then cancel or retry jobs (one by one or in bulk), pause, resume or
            trigger schedules, and stop, resume or resize channels.
        secret_key: signs the forms' CSRF tokens; default: random per process, so
            several processes behind one address (replicas, the workers of a
            pre-forking server without preload) need the same key, or each refuses
            the forms of the others' pages (``pypepper-dramatiq dashboard``:
            ``--secret-key-file`` or ``$PYPEPPER_DASHBOARD_SECRET_KEY``).

    Raises:
        TypeError: ``auth`` is not callable.
    """
    return Dashboard(
        store,
        broker,
        auth=auth,
        allow_anonymous_actions=allow_anonymous_actions,
        secret_key=secret_key,
    )
