"""``pypepper-dramatiq``: operate the job store and the channels from the shell.

Commands:

* ``migrate``: bring the database schema to this package's version.
* ``jobs``: list stored jobs, newest first, a page at a time (``--before``).
* ``show JOB_ID``: one job's stored snapshot as JSON.
* ``cancel JOB_ID``: cancel a stored job.
* ``retry JOB_ID [--from-task NAME]``: a new job takes a Failed or Cancelled
  one up where it stopped; prints the new job's id (exit 2 when refused).
* ``channels [list|stop|resume|resize]``: the channels kept in Redis (in the
  PostgreSQL job store with RabbitMQ);
  ``channels pause|resume NAME``: the channels paused in the job store.
* ``tasks [list|pause ID|resume ID]``: the task types paused in the job store.
* ``recurring [list|remove NAME|trigger NAME]``: the recurring schedules.
* ``purge --status S --older-than D``: delete the jobs that ended S longer
  than D ago (``--dry-run``: count them).
* ``workers``: the worker processes (live, or gone lately) and the steps each runs now.
* ``dashboard``: serve the web dashboard (``--host``, ``--port``; HTTP basic
  auth from ``PYPEPPER_DASHBOARD_USER`` / ``PYPEPPER_DASHBOARD_PASSWORD``; the
  forms' secret from ``--secret-key-file`` or ``PYPEPPER_DASHBOARD_SECRET_KEY``).

Exit status: 0 done, 1 the job or channel named is not there (or the job has
ended, or its stored row cannot be read: ``show`` names the column), 2 bad usage
or a store or Redis that cannot be used, 141 (128 + SIGPIPE, as ``git`` and the
coreutils give) the reader of the output went away first (``jobs | head``): the
command stops writing, quietly.

Every table cell and line of words goes through :func:`_print_table` or :func:`_say`,
which show stored and typed text with :func:`~pypepper_dramatiq.ops.display.printable`: a
category or an error holding an escape sequence cannot retitle or clear the terminal.
JSON output is printed as ``json.dumps`` writes it (ASCII, every control escaped), exact.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn
from urllib.parse import urlsplit, urlunsplit

from ..config import duration
from ..engine.job_io import publish_cancel
from ..errors import (
    AmbiguousTaskNameError,
    ConfigError,
    CorruptRecordError,
    InvalidTransitionError,
    PypepperError,
    RetryError,
    UnknownChannelError,
    UnknownExecutorError,
    UnknownJobError,
    UnknownScheduleError,
)
from ..ops.display import printable
from ..records import paging
from ..records.paging import encode_cursor
from ..records.pauses import CHANNEL as PAUSE_CHANNEL
from ..records.pauses import TASK as PAUSE_TASK
from ..records.state import BY_CLI
from ..records.workers import FORGET_AFTER_SECONDS, GONE_AFTER_BEATS, ListedWorker, listing
from ..rules.retention import BATCH
from ..rules.status import TERMINAL, Status
from ..stores.base import IJobStore, JobRecord, utcnow
from ..transport import Transport

if TYPE_CHECKING:  # the clients are imported when a command needs them
    from ..transport.postgres import PostgresTransport
    from ..transport.redis import RedisTransport

#: Where ``--uri`` and ``--broker-url`` are read from when not given.
URI_ENV, BROKER_ENV = "PYPEPPER_STORE_URI", "PYPEPPER_BROKER_URL"
#: Modules to import before a command rebuilds jobs (comma-separated), as ``--import``.
IMPORT_ENV = "PYPEPPER_IMPORT"
#: What to do about a task whose code this process has not imported.
_IMPORT_HINT = f"import the module of its tasks here: --import MODULE, or ${IMPORT_ENV}"
#: The dashboard's basic-auth credentials (both, or neither: read-only).
DASHBOARD_USER_ENV, DASHBOARD_PASSWORD_ENV = (
    "PYPEPPER_DASHBOARD_USER",
    "PYPEPPER_DASHBOARD_PASSWORD",
)
#: The dashboard's CSRF secret (``--secret-key-file`` wins), shared by its processes.
DASHBOARD_SECRET_ENV = "PYPEPPER_DASHBOARD_SECRET_KEY"
#: The shortest secret taken, in bytes.
DASHBOARD_SECRET_SHORTEST = 16

PROG = "pypepper-dramatiq"

#: Longest error shown in a row of the ``jobs`` table (``show`` has it whole).
ERROR_WIDTH = 40
#: The same for why a damaged row could not be read (the column and what it holds).
DAMAGE_WIDTH = 100

_REDIS_SCHEMES = ("redis", "rediss", "unix")
_RABBITMQ_SCHEMES = ("amqp", "amqps")

_CHANNEL_ACTIONS = ("list", "stop", "resume", "resize", "pause")
_TASK_ACTIONS = ("list", "pause", "resume")

_CHANNELS_HELP = """\
actions:
  list               every channel known in Redis (with an amqp:// broker URL:
                     in the PostgreSQL job store of --uri): jobs waiting,
                     bound (0 = unbounded), stop flag (the default action)
  stop NAME          refuse new jobs on NAME, in every process, until resumed;
                     queued jobs still run. An unknown NAME is created stopped
                     (to stop a channel before its producers start).
  resume NAME        with --broker-url: accept jobs on NAME again (lift its
                     stop); with --uri: start its jobs again (lift its pause:
                     the jobs held meanwhile start, oldest first); with both,
                     both. Nothing to lift is an error (exit 1)
  pause NAME         (needs --uri) accept jobs on NAME but start none, in
                     every process, until resumed; running steps finish. NAME
                     must be a channel some stored job uses (exit 1 otherwise)
  resize NAME N      set NAME's bound to N jobs waiting (0 = unbounded) for
                     every process; jobs already waiting stay. An unknown
                     NAME is created with that bound.

A bound given in code or YAML (setup(channels={NAME: N})) is written again
when a process starts; resize lasts until then. A pause lasts until resumed.
"""

_TASKS_HELP = """\
actions:
  list               the paused task types (the default action)
  pause ID           accept jobs of the task type ID (its executor id: a
                     @workflow_task's name) but start none of its steps, on any
                     channel, in every process, until resumed; running steps
                     finish. ID must be known: --import the module of the task
  resume ID          start its steps again: those held meanwhile start, oldest
                     first
"""

_RECURRING_HELP = """\
actions:
  list               every schedule: cron, time zone, next and last firing,
                     paused (the default action)
  remove NAME        delete the schedule (the jobs it fired stay)
  trigger NAME       fire it now, outside its slots (needs --broker-url);
                     prints the id of the job in charge
"""


def _add_uri(command: argparse.ArgumentParser, when: str = "") -> None:
    # Not required= for argparse: its usage would show --uri as needed even when
    # $PYPEPPER_STORE_URI gives it; main() says so when neither does.
    command.add_argument(
        "--uri",
        default=os.environ.get(URI_ENV) or None,
        help="SQLAlchemy URI of the job store (postgresql+psycopg://... or "
        f"mysql+pymysql://...){', ' + when if when else ''}; default: ${URI_ENV}",
    )


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _older_than(text: str) -> float:
    try:
        return duration("--older-than", text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--older-than ")) from None


# -- the jobs cursor ----------------------------------------------------------------------


def decode_cursor(text: str) -> tuple[datetime, str]:
    """The ``(created, id)`` a ``--before`` cursor holds (:mod:`~pypepper_dramatiq.records.paging`).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not such a cursor.
    """
    found = paging.decode_cursor(text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cursor printed by '{PROG} jobs' (after 'next page:')"
        )
    return found


# -- the parser ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors show the arguments they quote escaped (its
    subcommands' parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        super().error(printable(message))


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(
        prog=PROG, description="Operate the job store and the channels from the shell."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    migrate = commands.add_parser("migrate", help="upgrade the database schema to this version")
    _add_uri(migrate)

    show = commands.add_parser(
        "show",
        help="print one job's stored snapshot as JSON",
        description="Print one job's stored snapshot as JSON, as stored: positions count "
        "from 0 there (the cursor, each attempt's round and attempt in the history), where "
        "the logs, the tables and the dashboard count attempts and rounds from 1.",
    )
    show.add_argument("job_id")
    _add_uri(show)
    show.add_argument(
        "--json",
        action="store_true",
        help="one line of JSON, as 'jobs --json' prints (default: indented JSON)",
    )

    cancel = commands.add_parser("cancel", help="cancel a stored job by id")
    cancel.add_argument("job_id")
    _add_uri(cancel)
    cancel.add_argument(
        "--broker-url",
        default=os.environ.get(BROKER_ENV) or None,
        help="redis://... of the workers: running tasks see the cancel at once "
        f"(without it, at their next lease renewal); default: ${BROKER_ENV}",
    )

    retry = commands.add_parser(
        "retry",
        help="retry a Failed or Cancelled job: a new job takes it up where it stopped",
        description="Schedule a new job that takes the Failed or Cancelled job JOB_ID up "
        "at the task where it stopped (or at --from-task), with the results of the tasks "
        "before it kept, and print its id. JOB_ID stays as it ended. The new job is "
        "rebuilt here, so the code of its tasks must be imported: --import the modules "
        "that define them. Exit status 2 when the job cannot be retried.",
    )
    retry.add_argument("job_id")
    retry.add_argument(
        "--from-task",
        metavar="NAME",
        help="start at this task: its name, or its position workflow.task (such as 0.1) "
        "when several tasks have the name; where the job stopped, or earlier",
    )
    _add_imports(retry)
    _add_uri(retry)
    retry.add_argument(
        "--broker-url",
        default=os.environ.get(BROKER_ENV) or None,
        help=f"redis://... of the workers, which run the new job; default: ${BROKER_ENV}",
    )

    jobs = commands.add_parser(
        "jobs",
        help="list stored jobs, newest first",
        description="List stored jobs, newest first, --limit at a time. When more "
        "match, the cursor of the next page is printed on stderr "
        "('next page: --before CURSOR'): pass it to get the older jobs.",
    )
    _add_uri(jobs)
    jobs.add_argument("--status", choices=[status.value for status in Status])
    jobs.add_argument("--channel")
    jobs.add_argument("--category")
    jobs.add_argument("--limit", type=_limit, default=100, help="jobs per page (100)")
    jobs.add_argument(
        "--before",
        type=decode_cursor,
        metavar="CURSOR",
        help="the page after the one that printed this cursor",
    )
    jobs.add_argument(
        "--json",
        action="store_true",
        help="JSON lines, one whole stored record per line (for scripts); default: a table",
    )

    channels = commands.add_parser(
        "channels",
        help="list, stop, resume or resize the channels kept in Redis (or PostgreSQL)",
        description="The channels' bounds and stop flags, as kept for every process: in "
        "Redis, or with RabbitMQ in the PostgreSQL job store.",
        epilog=_CHANNELS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    channels.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=_CHANNEL_ACTIONS,
        help="what to do (list by default; see below)",
    )
    channels.add_argument("name", nargs="?", metavar="NAME", help="the channel")
    channels.add_argument("size", nargs="?", metavar="N", help="the bound, for resize")
    broker_url = os.environ.get(BROKER_ENV) or None
    channels.add_argument(
        "--broker-url",
        default=broker_url,
        help="redis://... of the producers and workers (Redis >= 6), or their amqp://... "
        "(RabbitMQ: the channels are then read in the PostgreSQL job store --uri names), "
        f"for list, stop, resume and resize; default: ${BROKER_ENV}",
    )
    _add_uri(channels, "for pause and resume")
    channels.add_argument(
        "--json", action="store_true", help="list as JSON lines (default: a table)"
    )

    tasks = commands.add_parser(
        "tasks",
        help="list, pause or resume the task types paused in the job store",
        description="The task types paused in the job store, for every process.",
        epilog=_TASKS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tasks.add_argument("action", nargs="?", default="list", choices=_TASK_ACTIONS)
    tasks.add_argument("task_id", nargs="?", metavar="ID", help="the task's executor id")
    _add_uri(tasks)
    tasks.add_argument(
        "--json", action="store_true", help="list as JSON lines (default: one id a line)"
    )
    _add_imports(tasks, "pause checks that the task type exists")
    recurring = commands.add_parser(
        "recurring",
        help="list, remove or trigger the recurring schedules",
        description="The recurring schedules kept in the job store.",
        epilog=_RECURRING_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    recurring.add_argument(
        "action", nargs="?", default="list", choices=("list", "remove", "trigger")
    )
    recurring.add_argument("name", nargs="?", metavar="NAME", help="the schedule")
    _add_uri(recurring)
    recurring.add_argument(
        "--broker-url",
        default=broker_url,
        help=f"redis://... of the workers, for trigger; default: ${BROKER_ENV}",
    )
    recurring.add_argument(
        "--json", action="store_true", help="list as JSON lines (default: a table)"
    )
    _add_imports(recurring, "trigger rebuilds the schedule's template job")

    workers = commands.add_parser(
        "workers",
        help="list the worker processes and the steps each runs now",
        description="The dramatiq worker processes running this package's middleware, as "
        "their heartbeat rows in the job store say: host, pid, since when, last heartbeat, "
        f"live or gone (no heartbeat for {GONE_AFTER_BEATS} of its intervals: killed, or "
        "cut off), and the steps each holds now (InProgress jobs leased to it). A worker "
        "stopped cleanly is not listed; a gone one is listed for "
        f"{FORGET_AFTER_SECONDS / 3600:g} hour.",
    )
    _add_uri(workers)
    workers.add_argument(
        "--json",
        action="store_true",
        help="JSON lines, one worker per line with its steps (default: tables)",
    )

    purge = commands.add_parser(
        "purge",
        help="delete the jobs that ended longer ago than --older-than",
        description="Delete the jobs that ended with --status more than --older-than "
        f"ago (by their last update), {BATCH:,} rows per statement. Jobs that have not "
        "ended are never deleted, nor jobs another job still needs (the parents of a "
        "job that waits, jobs whose on_final_failure hook has not run). Prints how many "
        "were deleted. setup(retention=...) makes the workers do the same.",
    )
    _add_uri(purge)
    purge.add_argument("--status", required=True, choices=sorted(s.value for s in TERMINAL))
    purge.add_argument(
        "--older-than",
        required=True,
        type=_older_than,
        metavar="DURATION",
        help='seconds, or a number and a unit: 90s, 15m, 12h, 7d, 2w, "1 week", "2 days"',
    )
    purge.add_argument(
        "--dry-run", action="store_true", help="count the jobs it would delete; delete none"
    )
    purge.add_argument("--json", action="store_true", help="one line of JSON (default: words)")

    dashboard = commands.add_parser(
        "dashboard",
        help="serve the web dashboard",
        description="Serve the web dashboard (jobs, one job's history, schedules, channels) "
        "with waitress, a production WSGI server (threads, pure Python). With "
        f"${DASHBOARD_USER_ENV} and ${DASHBOARD_PASSWORD_ENV} set it asks for them (HTTP "
        "basic auth) and may cancel and retry jobs and pause, resume or trigger schedules; "
        "without them it is read-only. Retry and Trigger rebuild jobs: --import the modules "
        "of their tasks. Needs the dashboard extra: pip install 'pypepper-dramatiq[dashboard]'.",
    )
    _add_uri(dashboard)
    dashboard.add_argument(
        "--broker-url",
        default=broker_url,
        help="redis://... of the workers: the channels page, and cancels and firings "
        f"reach them at once; default: ${BROKER_ENV}",
    )
    dashboard.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)"
    )
    dashboard.add_argument(
        "--port", type=int, default=8080, help="port to listen on (8080; 0: any free one)"
    )
    dashboard.add_argument(
        "--threads", type=int, default=8, help="requests served at once (8, waitress's threads)"
    )
    _add_imports(dashboard, "Retry and Trigger rebuild jobs")
    dashboard.add_argument(
        "--secret-key-file",
        metavar="PATH",
        help="file holding the secret that signs the forms' tokens (at least "
        f"{DASHBOARD_SECRET_SHORTEST} bytes; surrounding whitespace is dropped): the same "
        "in every dashboard process behind one address, so that each takes the forms of "
        f"the others' pages; default: ${DASHBOARD_SECRET_ENV}, else random per process",
    )
    return parser


def _add_imports(parser: argparse.ArgumentParser, why: str = "") -> None:
    """The ``--import MODULE`` option of a command that rebuilds jobs from their rows,
    which needs the code of their tasks (their ``@workflow_task`` functions)."""
    reason = f" ({why})" if why else ""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import MODULE first (the current directory is on the path): where the "
        f"jobs' @workflow_task functions are{reason}; may be repeated; default: "
        f"${IMPORT_ENV} (comma-separated)",
    )


def _task_modules(args: argparse.Namespace) -> list[str]:
    """The modules to import: ``--import``'s, else ``$PYPEPPER_IMPORT``'s."""
    given: list[str] = list(getattr(args, "imports", []) or [])
    if not given:
        given = [m.strip() for m in os.environ.get(IMPORT_ENV, "").split(",") if m.strip()]
    return given


def _import_task_modules(args: argparse.Namespace) -> None:
    """Import the task modules a command was given, as ``dramatiq`` imports its
    modules (the current directory on the path).

    Raises:
        ImportError: a module cannot be imported (its own error, for the message).
    """
    modules = _task_modules(args)
    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        importlib.import_module(module)  # it may call setup(): the command's comes after


def _check_channel_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The NAME and N an action needs, and no more; argparse's usage error otherwise."""
    usage = {
        "list": "list",
        "stop": "stop NAME",
        "resume": "resume NAME",
        "resize": "resize NAME N",
        "pause": "pause NAME",
    }[args.action]
    wanted = {"list": 0, "stop": 1, "resume": 1, "resize": 2, "pause": 1}[args.action]
    given = [value for value in (args.name, args.size) if value is not None]
    if len(given) != wanted:
        parser.error(f"channels {args.action} takes {wanted or 'no'} argument(s): channels {usage}")
    if args.name is not None and not args.name:
        parser.error("channels: NAME must not be empty")
    if args.action == "resize":
        try:
            size = int(args.size)
        except ValueError:
            size = -1
        if size < 0:
            parser.error(f"channels resize: N must be a whole number >= 0, got {args.size!r}")
        args.size = size


#: The exit status when the output's reader went away (``jobs --json | head``): 128 +
#: SIGPIPE, what a shell shows for ``git log | head`` or ``yes | head``. Not 0: the output
#: was cut short, and a script under ``set -o pipefail`` may want to know.
PIPE_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (see the module's docstring)."""
    try:
        status = _run(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe would be a traceback
    except BrokenPipeError:
        _drop_stdout()
        return PIPE_CLOSED
    return status


def _drop_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's flush at exit (of what
    is still buffered for the reader that went away) writes nowhere instead of failing."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no file descriptor behind stdout (a test's capture)
        pass


def _run(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if hasattr(args, "uri") and not args.uri and args.command != "channels":
        parser.error(f"{args.command} needs --uri (or ${URI_ENV}): the job store")
    if args.command == "channels":
        _check_channel_arguments(parser, args)
        if args.action == "pause" and not args.uri:
            parser.error(f"channels pause needs --uri (or ${URI_ENV}): the job store")
        if args.action == "resume" and not (args.uri or args.broker_url):
            parser.error(
                f"channels resume needs --broker-url (or ${BROKER_ENV}) to lift a stop, "
                f"--uri (or ${URI_ENV}) to lift a pause"
            )
        if args.action not in ("pause", "resume") and not args.broker_url:
            parser.error(f"channels {args.action} needs --broker-url (or ${BROKER_ENV})")
        if args.action in ("pause", "resume") and args.uri:
            return _pause_channel(args)
        return _channels(args)
    if args.command == "tasks" and (args.action == "list") != (args.task_id is None):
        parser.error(f"tasks {args.action} takes {'no' if args.action == 'list' else 'an'} ID")
    if args.command == "recurring":
        if (args.action == "list") != (args.name is None):
            parser.error(
                f"recurring {args.action} takes {'no' if args.action == 'list' else 'a'} NAME"
            )
        if args.action == "trigger" and not args.broker_url:
            parser.error(f"recurring trigger needs --broker-url (or ${BROKER_ENV})")
    if args.command == "retry" and not args.broker_url:
        parser.error(f"retry needs --broker-url (or ${BROKER_ENV}): the workers run the new job")

    try:
        if args.command == "migrate":
            from ..stores.sql import upgrade_schema

            print(f"schema at revision {upgrade_schema(args.uri)}")
            return 0
        from ..stores.sql import SqlJobStore

        store = SqlJobStore(args.uri)
        try:
            if args.command == "cancel":
                return _cancel(store, args.job_id, args.broker_url)
            if args.command == "retry":
                return _retry(store, args)
            if args.command == "show":
                return _show(store, args.job_id, one_line=args.json)
            if args.command == "recurring":
                return _recurring(store, args)
            if args.command == "purge":
                return _purge(store, args)
            if args.command == "workers":
                return _workers(store, as_json=args.json)
            if args.command == "tasks":
                return _tasks(store, args)
            if args.command == "dashboard":
                return _dashboard(store, args)
            return _jobs(store, args)
        finally:
            store.close()
    except (PypepperError, ValueError) as exc:
        _error(str(exc))
        return 2


def _say(text: str, *, stderr: bool = False) -> None:
    """Print a line of words that may quote user text, each interpreted character escaped."""
    print(printable(text), file=sys.stderr if stderr else sys.stdout)


def _error(message: str) -> None:
    _say(f"{PROG}: {message}", stderr=True)


# -- jobs, show, cancel ----------------------------------------------------------------------


def _show(store: IJobStore, job_id: str, *, one_line: bool) -> int:
    try:
        record = store.get(job_id)
    except CorruptRecordError as exc:
        _error(
            f"{exc} (the row was changed by something other than "
            "pypepper-dramatiq; mend or delete it: no worker runs it meanwhile, and "
            "'jobs' lists it as damaged)"
        )
        return 1
    if record is None:
        _error(str(UnknownJobError(job_id)))  # the words of 'cancel' for the same case
        return 1
    shown = record.to_dict()
    if record.status is Status.SCHEDULED:
        shown["waiting_for"] = record.waiting_for()
    if record.progress:
        shown["progress"] = record.progress
    print(json.dumps(shown, indent=None if one_line else 2))
    return 0


def _jobs(store: IJobStore, args: argparse.Namespace) -> int:
    # One row more than a page tells whether there is a next page, without a count.
    found = store.list(
        status=args.status,
        channel_id=args.channel,
        category=args.category,
        limit=args.limit + 1,
        newest_first=True,
        before=args.before,
    )
    page = list(found[: args.limit])
    if args.json:
        for record in page:
            shown = record.to_dict()
            if record.damaged is not None:
                shown["damaged"] = record.damaged
            print(json.dumps(shown))
    elif page:
        _print_table(
            ("ID", "STATUS", "CHANNEL", "CATEGORY", "CREATED", "UPDATED", "ERROR"),
            [_job_row(record) for record in page],
        )
    else:
        print("no stored job matches", file=sys.stderr)
    if len(found) > args.limit:
        last = page[-1]
        print(f"next page: --before {encode_cursor(last.created, last.id)}", file=sys.stderr)
    return 0


def _job_row(record: JobRecord) -> tuple[str, ...]:
    # A row that could not be read: "damaged" for its status, why in place of the error.
    told = (record.error if record.damaged is None else record.damaged) or ""
    error = told.strip().splitlines()
    width = ERROR_WIDTH if record.damaged is None else DAMAGE_WIDTH
    shown = error[0] if error else ""
    if len(shown) > width or len(error) > 1:
        shown = shown[: width - 3] + "..."
    return (
        record.id,
        record.status.value if record.damaged is None else "damaged",
        record.channel_id,
        record.category or "-",
        _when(record.created),
        _when(record.updated),
        shown,
    )


def _when(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Print ``rows`` under ``header`` in aligned columns, each cell :func:`printable`."""
    rows = [tuple(printable(cell) for cell in cells) for cells in rows]
    widths = [max(len(cells[i]) for cells in (header, *rows)) for i in range(len(header))]
    for cells in (header, *rows):
        padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        print("  ".join(padded).rstrip())


def _coordination_transport(
    store: IJobStore, broker_url: str
) -> RedisTransport | PostgresTransport:
    """What the processes share besides the job rows (cancels told to running tasks,
    the channels' bounds and stop flags): Redis for a Redis URL; for an ``amqp://`` one
    (RabbitMQ), the job store's PostgreSQL database (NOTIFY, the channel rows).

    Raises:
        ValueError: a URL Redis cannot use, or RabbitMQ with a store not on PostgreSQL.
    """
    if urlsplit(broker_url).scheme.lower() in _RABBITMQ_SCHEMES:
        engine = getattr(store, "engine", None)
        if engine is None or engine.dialect.name != "postgresql":
            raise ValueError(
                "with RabbitMQ, cancels are told through the PostgreSQL job store; "
                "this --uri is not on PostgreSQL"
            )
        from ..transport.postgres import PostgresTransport

        return PostgresTransport(engine)
    from ..transport.redis import RedisTransport

    return RedisTransport.from_url(broker_url)


def _cancel(store: IJobStore, job_id: str, broker_url: str | None) -> int:
    from ..model.job import Job
    from ..stores.registry import reset_job_store, set_job_store

    # A broker URL that cannot be used is refused before anything is written.
    transport = _coordination_transport(store, broker_url) if broker_url else None
    set_job_store(store)
    try:
        if not Job.cancel_saved(job_id, by=BY_CLI):
            _error(f"job {job_id} kept changing; try again")
            return 1
        told = "workers see it at their next lease renewal"
        if transport is not None:
            told = (
                "running tasks were told"
                if publish_cancel(job_id, transport)
                else (f"{transport.where} could not be told; {told}")
            )
        _say(f"job {job_id} cancelled ({told})")
        return 0
    except UnknownJobError as exc:
        _error(str(exc))
        return 1
    except InvalidTransitionError as exc:
        _error(f"job {job_id} has already ended ({exc.status}): nothing was cancelled")
        return 1
    finally:
        reset_job_store()
        if transport is not None:
            transport.close()


def _retry(store: IJobStore, args: argparse.Namespace) -> int:
    from ..drivers.dramatiq.setup import setup
    from ..model.job import Job
    from ..stores.registry import reset_job_store, set_job_store

    set_job_store(store)
    try:
        _import_task_modules(args)
        setup(args.broker_url)
        set_job_store(store)
        new_id = Job.retry_saved(args.job_id, from_task=args.from_task)
    except ImportError as exc:
        _error(f"--import: {exc}")
        return 2
    except (UnknownJobError, RetryError, AmbiguousTaskNameError, UnknownExecutorError) as exc:
        # Every refusal of a retry is status 2: nothing was stored or sent.
        unknown_id = isinstance(exc, UnknownExecutorError) and exc.executor_id is not None
        hint = f" ({_IMPORT_HINT})" if unknown_id else ""
        _error(f"{exc}{hint}")
        return 2
    finally:
        reset_job_store()
    _say(new_id)
    _say(f"job {args.job_id} is retried by job {new_id}", stderr=True)
    return 0


# -- recurring schedules ---------------------------------------------------------------------


def _recurring(store: IJobStore, args: argparse.Namespace) -> int:
    from ..schedules.firing import trigger_recurring
    from ..stores.registry import reset_job_store, set_job_store

    if args.action == "list":
        schedules = store.list_recurring()
        if args.json:
            for schedule in schedules:
                print(json.dumps(_schedule_dict(schedule)))
        elif schedules:
            _print_table(
                ("NAME", "CRON", "TIMEZONE", "NEXT", "LAST", "LAST JOB", "PAUSED"),
                [
                    (
                        s.name,
                        s.cron,
                        s.timezone,
                        _when(s.next_slot),
                        _when(s.last_slot) if s.last_slot else "-",
                        s.last_job_id or "-",
                        "damaged" if s.damaged else "yes" if s.paused else "no",
                    )
                    for s in schedules
                ],
            )
        else:
            print("no recurring schedule is stored", file=sys.stderr)
        return 0
    if args.action == "remove":
        if not store.delete_recurring(args.name):
            _error(str(UnknownScheduleError(args.name)))
            return 1
        _say(f"recurring schedule {args.name} removed")
        return 0
    from ..drivers.dramatiq.setup import setup

    set_job_store(store)
    try:
        _import_task_modules(args)
        setup(args.broker_url)
        set_job_store(store)
        job_id = trigger_recurring(args.name)
    except ImportError as exc:
        _error(f"--import: {exc}")
        return 2
    except UnknownScheduleError as exc:
        _error(str(exc))
        return 1
    except UnknownExecutorError as exc:
        _error(f"recurring schedule {args.name} not fired: {exc} ({_IMPORT_HINT})")
        return 2
    finally:
        reset_job_store()
    _say(f"recurring schedule {args.name} fired: job {job_id}")
    return 0


def _schedule_dict(schedule: Any) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "next_slot": schedule.next_slot.isoformat(),
        "last_slot": schedule.last_slot.isoformat() if schedule.last_slot else None,
        "last_job_id": schedule.last_job_id,
        "paused": schedule.paused,
        "overlap": schedule.overlap,
        "catch_up": schedule.catch_up,
        "max_start_delay": schedule.max_start_delay,
        "channel_id": schedule.template.get("channel_id"),
        "category": schedule.template.get("category"),
        **({"damaged": schedule.damaged} if schedule.damaged else {}),
    }


# -- purge ---------------------------------------------------------------------------------------


def _purge(store: IJobStore, args: argparse.Namespace) -> int:
    ended_before = utcnow() - timedelta(seconds=args.older_than)
    if args.dry_run:
        count = len(store.purge(args.status, ended_before, sys.maxsize, dry_run=True))
    else:
        count = 0
        while True:  # a statement per batch, each its own transaction
            deleted = len(store.purge(args.status, ended_before, BATCH))
            count += deleted
            if deleted < BATCH:
                break
    if args.json:
        shown = {
            "status": args.status,
            "ended_before": ended_before.isoformat(),
            "dry_run": args.dry_run,
            "count": count,
        }
        print(json.dumps(shown))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(f"{verb} {count} {args.status} jobs that ended before {_when(ended_before)}")
    return 0


# -- dashboard -------------------------------------------------------------------------------


def _dashboard(store: IJobStore, args: argparse.Namespace) -> int:
    from ..stores.registry import reset_job_store, set_job_store

    try:
        from waitress import create_server

        from ..web import basic_auth, make_app
    except ImportError as exc:
        _error(str(exc))
        return 2
    user = os.environ.get(DASHBOARD_USER_ENV) or ""
    password = os.environ.get(DASHBOARD_PASSWORD_ENV) or ""
    if bool(user) != bool(password):
        _error(f"set both ${DASHBOARD_USER_ENV} and ${DASHBOARD_PASSWORD_ENV}, or neither")
        return 2
    try:
        secret = _dashboard_secret(args.secret_key_file)
    except ValueError as exc:
        _error(str(exc))
        return 2
    set_job_store(store)
    try:
        try:
            _import_task_modules(args)
        except ImportError as exc:
            _error(f"--import: {exc}")
            return 2
        if args.broker_url:
            from ..drivers.dramatiq.setup import setup

            setup(args.broker_url)  # cancels are published, firings sent, on this Redis
            set_job_store(store)
        app = make_app(auth=basic_auth(user, password) if user else None, secret_key=secret)
        mode = "basic auth" if user else f"read-only (no ${DASHBOARD_USER_ENV})"
        forms = "a shared form secret" if secret else "a form secret of its own"
        server = create_server(app, host=args.host, port=args.port, threads=args.threads)
        port = getattr(server, "effective_port", args.port)  # 0: the one the system chose
        _say(f"dashboard on http://{args.host}:{port}/, {mode}, {forms}", stderr=True)
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
    finally:
        reset_job_store()
    return 0


def _dashboard_secret(path: str | None) -> bytes | None:
    """The forms' secret: the file's bytes, else ``$PYPEPPER_DASHBOARD_SECRET_KEY``'s,
    each without surrounding whitespace; None when neither is given (random per process).

    Raises:
        ValueError: the file cannot be read, or the secret is too short.
    """
    if path is not None:
        source = f"--secret-key-file {path}"
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --secret-key-file: {exc}") from None
    else:
        source = f"${DASHBOARD_SECRET_ENV}"
        secret = (os.environ.get(DASHBOARD_SECRET_ENV) or "").strip().encode()
        if not secret:
            return None
    if len(secret) < DASHBOARD_SECRET_SHORTEST:
        raise ValueError(
            f"the secret of {source} is {len(secret)} bytes long; "
            f"at least {DASHBOARD_SECRET_SHORTEST} are needed"
        )
    return secret


# -- channels ------------------------------------------------------------------------------


def _masked(url: str) -> str:
    """``url`` with its password hidden."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _channels(args: argparse.Namespace) -> int:
    """The channels' bounds and stop flags where the processes share them: in Redis for
    a Redis broker URL; for an ``amqp://`` one (RabbitMQ), in the PostgreSQL job store
    that ``--uri`` names."""
    url: str = args.broker_url
    scheme = urlsplit(url).scheme.lower()
    store: IJobStore | None = None
    transport: Transport
    try:
        if scheme in _RABBITMQ_SCHEMES:
            if not args.uri:
                _error(
                    f"--broker-url {_masked(url)!r} is RabbitMQ: its channels are kept in the "
                    f"PostgreSQL job store; give it with --uri (or ${URI_ENV})"
                )
                return 2
            from ..stores.sql import SqlJobStore

            store = SqlJobStore(args.uri)
            transport = _coordination_transport(store, url)
        elif scheme in _REDIS_SCHEMES:
            from ..transport.redis import RedisTransport

            transport = RedisTransport.from_url(url, socket_connect_timeout=5, socket_timeout=10)
        else:
            _error(
                f"--broker-url {_masked(url)!r}: expected a redis://, rediss://, unix:// "
                "or amqp:// URL"
            )
            return 2
    except (ValueError, PypepperError) as exc:
        _error(f"--broker-url {_masked(url)!r}: {exc}")
        if store is not None:
            store.close()
        return 2
    unusable: tuple[type[Exception], ...] = (*transport.errors, PypepperError)
    try:
        if args.action == "list":
            return _list_channels(transport, as_json=args.json)
        return _change_channel(transport, args.action, args.name, args.size)
    except unusable as exc:
        _error(f"{transport.where} cannot be used for the channels: {exc}")
        return 2
    finally:
        transport.close()
        if store is not None:
            store.close()


def _list_channels(transport: Transport, *, as_json: bool) -> int:
    rows = [
        {
            "channel": state.name,
            "waiting": state.waiting,
            "maxsize": state.maxsize,
            "stopped": state.stopped,
            "rate_limit": state.rate_limit,
            "max_running": state.max_running,
            "running": state.running,
        }
        for state in transport.channel_states() or []
    ]
    if as_json:
        for row in rows:
            print(json.dumps(row))
    elif rows:
        _print_table(
            ("CHANNEL", "WAITING", "BOUND", "STOPPED", "RATE LIMIT", "RUNNING (LIMIT)"),
            [
                (
                    str(r["channel"]),
                    str(r["waiting"]),
                    str(r["maxsize"] or "unbounded"),
                    "yes" if r["stopped"] else "no",
                    str(r["rate_limit"] or "-"),
                    # As the dashboard's Channels page says it: "2 of 3".
                    "-"
                    if r["max_running"] is None
                    else f"{r['running'] or 0} of {r['max_running']}",
                )
                for r in rows
            ],
        )
    else:
        print(f"no channel is known in {transport.where}", file=sys.stderr)
    return 0


def _change_channel(transport: Transport, action: str, name: str, size: int | None) -> int:
    gate = transport.gate(name)  # no bound given: the stored one is kept
    known = gate.known()
    if action == "resume" and not known:
        _error(f"no channel {name!r} is known in {transport.where}; nothing to resume")
        return 1
    if not known:
        _say(f"channel {name} was not known in {transport.where}: created", stderr=True)
    if action == "stop":
        gate.request_stop()
        _say(
            f"channel {name} stopped: new jobs are refused until "
            f"'{PROG} channels resume {name}'; queued jobs still run"
        )
    elif action == "resume":
        gate.resume()
        _say(f"channel {name} resumed")
    else:
        assert size is not None  # checked with the arguments
        before = gate.resize(size)
        bound = f"{size}" if size else "0 (unbounded)"
        _say(
            f"channel {name}: bound {before} -> {bound}"
            if before != size
            else f"channel {name}: bound {bound}, unchanged"
        )
    return 0


# -- pauses ------------------------------------------------------------------------------------


class _PauseWords(NamedTuple):
    """How the CLI speaks of one kind of pause, so one sentence serves both kinds."""

    noun: str
    group: str  #: the command group (``channels``, ``tasks``)
    unstarted: str  #: what a pause keeps from starting
    held: str  #: what a resume starts


#: The words of each kind of pause.
_PAUSE_WORDS = {
    PAUSE_CHANNEL: _PauseWords("channel", "channels", "none starts", "held jobs"),
    PAUSE_TASK: _PauseWords("task", "tasks", "none of its steps starts", "held steps"),
}


def _pause(store: IJobStore, kind: str, name: str) -> int:
    """Pauses ``name`` and says so, or that it was paused already."""
    from ..engine.pausing import pause_in

    words = _PAUSE_WORDS[kind]
    _say(
        f"{words.noun} {name} paused: its jobs are accepted and {words.unstarted} until "
        f"'{PROG} {words.group} resume {name}'; running steps finish"
        if pause_in(store, kind, name)
        else f"{words.noun} {name} was paused already"
    )
    return 0


def _resume(store: IJobStore, kind: str, name: str) -> bool:
    """Resumes ``name`` and says so; False (nothing said) when it was not paused."""
    from ..engine.pausing import resume_in

    resumed = resume_in(store, kind, name)
    if resumed:
        words = _PAUSE_WORDS[kind]
        _say(f"{words.noun} {name} resumed: its {words.held} start")
    return resumed


def _not_paused(kind: str, name: str) -> int:
    _error(f"{_PAUSE_WORDS[kind].noun} {name!r} is not paused; nothing to resume")
    return 1


def _pause_channel(args: argparse.Namespace) -> int:
    """``channels pause NAME`` and ``channels resume NAME --uri`` (then, with
    ``--broker-url`` too, the stop flag is lifted as well)."""
    from ..stores.sql import SqlJobStore

    name: str = args.name
    try:
        store = SqlJobStore(args.uri)
        try:
            if args.action == "pause":
                return _pause(store, PAUSE_CHANNEL, name)
            resumed = _resume(store, PAUSE_CHANNEL, name)
        finally:
            store.close()
    except UnknownChannelError as exc:
        if not (args.action == "resume" and args.broker_url):
            _error(str(exc))
            return 1
        resumed = False  # no pause to lift; its stop flag may be
    except (PypepperError, ValueError) as exc:
        _error(str(exc))
        return 2
    if args.broker_url:  # the stop flag too
        lifted = _channels(args)
        return 0 if resumed else lifted
    return 0 if resumed else _not_paused(PAUSE_CHANNEL, name)


def _tasks(store: IJobStore, args: argparse.Namespace) -> int:
    """``tasks [list|pause ID|resume ID]``."""
    if args.action == "list":
        paused = sorted(name for kind, name in store.paused() if kind == PAUSE_TASK)
        for name in paused:
            print(json.dumps({"task": name}) if args.json else printable(name))
        if not paused and not args.json:
            print("no task type is paused", file=sys.stderr)
        return 0
    task_id: str = args.task_id
    try:
        _import_task_modules(args)
    except ImportError as exc:
        _error(f"--import: {exc}")
        return 2
    try:
        if args.action == "pause":
            return _pause(store, PAUSE_TASK, task_id)
        resumed = _resume(store, PAUSE_TASK, task_id)
    except UnknownExecutorError as exc:
        _error(f"{exc} ({_IMPORT_HINT})")
        return 1
    return 0 if resumed else _not_paused(PAUSE_TASK, task_id)


# -- workers -----------------------------------------------------------------------------------


def _workers(store: IJobStore, *, as_json: bool) -> int:
    now = utcnow()
    found = store.workers(now)
    shown = listing(found, store.held_by([w.owner for w in found]), now)
    if as_json:
        for entry in shown:
            print(json.dumps(entry.to_dict()))
        return 0
    if not shown:
        print("no worker process is known (each writes its row when it starts)", file=sys.stderr)
        return 0
    _print_table(
        ("HOST", "PID", "STATE", "STARTED", "LAST SEEN", "CHANNELS", "STEPS", "OWNER"),
        [_worker_row(entry) for entry in shown],
    )
    steps = [(entry, step) for entry in shown for step in entry.steps]
    if steps:
        print()
        _print_table(
            ("HOST", "PID", "JOB", "TASK", "ROUND", "ATTEMPT", "SINCE"),
            [
                (
                    entry.worker.host,
                    str(entry.worker.pid),
                    step.job_id,
                    f"{step.task or '?'} ({step.key})" if step.key else "-",
                    "-" if step.round is None else str(step.round + 1),
                    "-" if step.attempt is None else str(step.attempt + 1),
                    _when(step.since),
                )
                for entry, step in steps
            ],
        )
    return 0


def _worker_row(entry: ListedWorker) -> tuple[str, ...]:
    worker = entry.worker
    state = entry.state
    if state != "live":
        state = f"{state} ({entry.silent_for:.0f}s)"
    return (
        worker.host,
        str(worker.pid),
        state,
        _when(worker.started),
        _when(worker.last_seen),
        ",".join(worker.channels) or "-",
        str(len(entry.steps)),
        worker.owner,
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
