"""A producer process for ``test_transactional_enqueue_processes``.

Run as ``python transactional_producer.py REDIS_URL STORE_URI MODE`` with this
directory as cwd. It schedules one job with ``scheduled(connection=session)``
inside a SQLAlchemy Session, prints the job id, then:

* ``commit-then-die``: commits, and SIGKILLs itself from its own ``after_commit``
  listener, registered before the job's: the job's row is committed, and this
  process dies before it could send the job's message;
* ``rollback``: rolls back and exits normally.
"""

from __future__ import annotations

import os
import signal
import sys

from sqlalchemy import create_engine, event
from sqlalchemy.orm import Session
from worker_app import CHANNEL, probe  # this directory is the cwd (sys.path[0])

from pypepper_dramatiq import Job, Workflow, setup


def main(redis_url: str, store_uri: str, mode: str) -> None:
    setup(redis_url, store_uri, channels={CHANNEL: 0})
    engine = create_engine(store_uri)
    job = Job(category="it-tx", channel_id=CHANNEL)
    job.workflows.append(Workflow([probe.task(name="tx")]))
    with Session(engine) as session:
        if mode == "commit-then-die":
            event.listen(session, "after_commit", lambda _s: os.kill(os.getpid(), signal.SIGKILL))
        job.scheduled(connection=session)
        print(job.id, flush=True)
        if mode == "rollback":
            session.rollback()
        else:
            session.commit()


if __name__ == "__main__":
    main(*sys.argv[1:])
