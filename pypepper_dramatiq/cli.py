"""``pypepper-dramatiq``: operate the job store from the shell."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from .errors import InvalidTransitionError, PypepperError, UnknownJobError
from .status import Status
from .stores.base import IJobStore

#: Where ``--uri`` and ``--broker-url`` are read from when not given.
URI_ENV, BROKER_ENV = "PYPEPPER_STORE_URI", "PYPEPPER_BROKER_URL"


def _add_uri(command: argparse.ArgumentParser) -> None:
    default = os.environ.get(URI_ENV) or None
    command.add_argument(
        "--uri", required=default is None, default=default,
        help="SQLAlchemy URI of the job store (postgresql+psycopg://... or "
        f"mysql+pymysql://...); default: ${URI_ENV}",
    )


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pypepper-dramatiq", description="Operate the job store from the shell."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    migrate = commands.add_parser("migrate", help="upgrade the database schema to this version")
    _add_uri(migrate)
    show = commands.add_parser("show", help="print one job's stored snapshot as JSON")
    show.add_argument("job_id")
    _add_uri(show)
    cancel = commands.add_parser("cancel", help="cancel a stored job by id")
    cancel.add_argument("job_id")
    _add_uri(cancel)
    cancel.add_argument(
        "--broker-url", default=os.environ.get(BROKER_ENV) or None,
        help="redis://... of the workers: running tasks see the cancel at once "
        f"(without it, at their next lease renewal); default: ${BROKER_ENV}",
    )
    jobs = commands.add_parser("jobs", help="list stored jobs as JSON lines")
    _add_uri(jobs)
    jobs.add_argument("--status", choices=[status.value for status in Status])
    jobs.add_argument("--channel")
    jobs.add_argument("--limit", type=_limit, default=100)
    args = parser.parse_args(argv)

    try:
        if args.command == "migrate":
            from .stores.sql import upgrade_schema

            print(f"schema at revision {upgrade_schema(args.uri)}")
            return 0
        from .stores.sql import SqlJobStore

        store = SqlJobStore(args.uri)
        try:
            if args.command == "cancel":
                return _cancel(store, args.job_id, args.broker_url)
            if args.command == "show":
                record = store.get(args.job_id)
                if record is None:
                    print(f"pypepper-dramatiq: no job {args.job_id}", file=sys.stderr)
                    return 1
                print(json.dumps(record.to_dict(), indent=2))
                return 0
            for record in store.list(
                status=args.status, channel_id=args.channel, limit=args.limit
            ):
                print(json.dumps(record.to_dict()))
            return 0
        finally:
            store.close()
    except (PypepperError, ValueError) as exc:
        print(f"pypepper-dramatiq: {exc}", file=sys.stderr)
        return 2


def _cancel(store: IJobStore, job_id: str, broker_url: str | None) -> int:
    import redis

    from .cancellation import publish_cancel
    from .job import Job
    from .store import reset_job_store, set_job_store

    # A broker URL redis cannot use is refused before anything is written.
    client = redis.Redis.from_url(broker_url) if broker_url else None
    set_job_store(store)
    try:
        if not Job.cancel_saved(job_id):
            print(f"pypepper-dramatiq: job {job_id} kept changing; try again", file=sys.stderr)
            return 1
        told = "workers see it at their next lease renewal"
        if client is not None:
            told = "running tasks were told" if publish_cancel(job_id, client) else (
                f"Redis could not be told; {told}"
            )
        print(f"job {job_id} cancelled ({told})")
        return 0
    except UnknownJobError as exc:
        print(f"pypepper-dramatiq: {exc}", file=sys.stderr)
        return 1
    except InvalidTransitionError as exc:
        print(f"pypepper-dramatiq: job {job_id} has ended: {exc}", file=sys.stderr)
        return 1
    finally:
        reset_job_store()
        if client is not None:
            client.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
