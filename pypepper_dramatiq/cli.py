"""``pypepper-dramatiq``: operate the job store from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .errors import PypepperError
from .status import Status


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pypepper-dramatiq", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    migrate = commands.add_parser("migrate", help="upgrade the database schema to this version")
    migrate.add_argument("--uri", required=True, help="SQLAlchemy URI of the job store")
    show = commands.add_parser("show", help="print one job's stored snapshot as JSON")
    show.add_argument("job_id")
    show.add_argument("--uri", required=True)
    jobs = commands.add_parser("jobs", help="list stored jobs as JSON lines")
    jobs.add_argument("--uri", required=True)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
