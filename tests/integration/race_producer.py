"""A producer process for the unique-key race of ``test_keys_waits_recurring``.

Run as ``python race_producer.py REDIS_URL STORE_URI COUNT KEY ON_CONFLICT`` with
this directory as cwd: it calls ``setup()``, prints ``ready``, reads a wall-clock
time on stdin and sleeps until then (the barrier every producer shares), then
calls ``Job(...).scheduled(unique_key=KEY, on_conflict=ON_CONFLICT)`` ``COUNT``
times, on a new job each time. It prints one JSON line on stdout:

* ``late``: how late it was at the barrier (seconds; 0 if it waited);
* ``first_call``: when its first ``scheduled()`` began and returned;
* ``created``: the id of each job it built;
* ``returned``: what each ``scheduled()`` returned (None where it raised);
* ``errors``: for each ``DuplicateJobError``, its ``unique_key`` and ``existing_id``.
"""

from __future__ import annotations

import json
import sys
import time

from worker_app import CHANNEL, probe  # this directory is the cwd (sys.path[0])

from pypepper_dramatiq import DuplicateJobError, Job, Workflow, get_job_store, manager, setup


def main(argv: list[str]) -> None:
    redis_url, store_uri, count, key, on_conflict = argv
    broker = setup(redis_url, store_uri, channels={CHANNEL: 0})
    # Connect before the barrier, so that the calls race on the database, not on connecting.
    get_job_store().key_holder(key)
    manager.available(CHANNEL).connect()
    created: list[str] = []
    returned: list[str | None] = []
    errors: list[dict[str, str | None]] = []
    first_call: list[float] = []
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    late = max(0.0, time.time() - start_at)
    time.sleep(max(0.0, start_at - time.time()))
    for i in range(int(count)):
        job = Job(category="race", channel_id=CHANNEL)
        job.workflows.append(Workflow([probe.task(name="raced", value=i)]))
        created.append(job.id)
        began = time.time()
        try:
            returned.append(job.scheduled(unique_key=key, on_conflict=on_conflict))
        except DuplicateJobError as exc:
            returned.append(None)
            errors.append({"unique_key": exc.unique_key, "existing_id": exc.existing_id})
        if i == 0:
            first_call = [began, time.time()]
    broker.close()
    outcome = {"late": late, "first_call": first_call, "created": created}
    print(json.dumps(dict(outcome, returned=returned, errors=errors)))


if __name__ == "__main__":
    main(sys.argv[1:])
