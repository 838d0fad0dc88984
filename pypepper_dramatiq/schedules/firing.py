"""Recurring schedules: store them, list them, and fire their due slots.

A schedule's row says which slot comes next; each firing is a copy of the
schedule's job with a deterministic id (:func:`~pypepper_dramatiq.rules.cron.firing_id`),
inserted before its message is sent. So however many processes fire a slot,
the database keeps one job for it: the others find the id stored and send
nothing. ``overlap="skip"`` adds the unique key ``recurring:<name>``: a firing
whose previous one is still Scheduled or InProgress is skipped.

The ``dramatiq`` worker processes fire due slots in their recovery sweep (one
process at a time, every second); :func:`fire_due` does the same from any
process, :func:`trigger_recurring` fires one schedule now.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from ..engine.job_io import JOB_IO
from ..errors import DuplicateJobError, UnknownScheduleError
from ..limits.concurrency import CONCURRENCY_KEY_KEY, check_concurrency_key
from ..limits.rates import RATE_KEY_KEY, check_rate_key
from ..model.job import Job, ScheduleOptions
from ..ops import observers
from ..ops.display import printable
from ..ops.isolation import OnceEach
from ..ops.logs import get_logger
from ..ops.outage import cause_of, is_outage
from ..records.record import JobRecord, utcnow
from ..records.recurring import RecurringSchedule
from ..records.storable_job import check_job_record
from ..rules.cron import CATCH_UP, OVERLAP, CronSchedule, check_name, due_slots, firing_id
from ..rules.priorities import DEFAULT, check_priority, priority_in, with_priority
from ..rules.start_times import max_start_delay_seconds
from ..rules.waits import check_choice
from ..stores.base import IJobStore
from ..stores.registry import get_job_store

__all__ = [
    "RecurringSchedule",
    "fire_due",
    "list_recurring",
    "pause_recurring",
    "recurring",
    "remove_recurring",
    "resume_recurring",
    "trigger_recurring",
]

logger = get_logger(__name__)

#: The unique key the firings of a schedule with ``overlap="skip"`` share.
OVERLAP_KEY = "recurring:{name}"
#: Compare-and-set tries of :func:`pause_recurring` / :func:`resume_recurring`.
PAUSE_ATTEMPTS = 10


def recurring(
    name: str,
    cron: str,
    job: Job,
    *,
    timezone: str = "UTC",
    max_start_delay: float | timedelta | None = None,
    overlap: str = "skip",
    catch_up: str = "latest",
    priority: int | None = None,
    rate_key: str | None = None,
    concurrency_key: str | None = None,
) -> RecurringSchedule:
    """Store (or replace, by ``name``) a schedule that fires a copy of ``job`` at each slot.

    ``job`` is a template, never run itself: each firing is a new job with its
    channel, category and workflows (its tasks must use registered executors,
    so that a worker can rebuild them from the store).

    Replacing a schedule with the same ``cron`` and ``timezone`` keeps its next
    slot (a deploy that stores its schedules again misses nothing); a new
    expression or zone starts from the next slot after now.

    Args:
        name: the schedule's name, 1 to 128 characters.
        cron: a cron expression (5 fields, or 6 with seconds first).
        timezone: the IANA zone the expression is read in (``"Europe/Paris"``).
        max_start_delay: a firing not started this long after its slot is
            cancelled (downtime included).
        overlap: ``"skip"`` fires nothing while the previous firing is still
            Scheduled or InProgress; ``"allow"`` fires regardless.
        catch_up: after downtime, ``"latest"`` fires the most recent missed
            slot, ``"none"`` none, ``"all"`` each (at most 100, the most recent).
        priority: each firing's priority, 0 to 9 (see ``Job.scheduled``); None:
            ``job``'s own (``Job(priority=)``), else its first task's
            (``@workflow_task(priority=)``), else the application's default.
        rate_key: the key each firing's starts count against (see
            ``Job.scheduled``); None: ``job``'s own (``job.rate_key``), else none.
        concurrency_key: the key whose concurrency limit each firing's steps run
            under (see ``Job.scheduled``); None: ``job``'s own
            (``job.concurrency_key``), else none.

    Raises:
        ConfigError: a cron expression croniter cannot read, an unknown time
            zone (both named), or croniter not installed.
        ValueError: a bad name, overlap, catch_up or max_start_delay (named),
            or a value of ``job`` its firings' rows could not hold (named, as
            ``scheduled()`` names it); nothing is stored.
        InvalidPriorityError: ``priority`` is not a whole number from 0 to 9.
        InvalidRateKeyError: ``rate_key`` (or ``job``'s) is no text of 1 to 128
            characters a row can hold.
        InvalidConcurrencyKeyError: ``concurrency_key`` (or ``job``'s) is no
            non-empty text a row can hold; nothing is stored.
        UnknownExecutorError: a task of ``job`` has no registered executor.
    """
    check_name(name)
    priority = job.settle_priority() if priority is None else check_priority(priority)
    rate_key = job.rate_key if rate_key is None else rate_key
    if rate_key is not None:
        rate_key = check_rate_key(rate_key)
    concurrency_key = job.concurrency_key if concurrency_key is None else concurrency_key
    if concurrency_key is not None:
        concurrency_key = check_concurrency_key(concurrency_key)
    schedule = CronSchedule(cron, timezone)
    check_choice("overlap", overlap, OVERLAP)
    check_choice("catch_up", catch_up, CATCH_UP)
    delay_seconds = None if max_start_delay is None else max_start_delay_seconds(max_start_delay)
    now = utcnow()
    template = _template(job, rate_key, concurrency_key)
    if priority != DEFAULT:  # a schedule of no priority keeps the template it had
        template["priority"] = priority
    store = get_job_store()
    current = store.get_recurring(name)
    keep = current is not None and (current.cron, current.timezone) == (cron, timezone)
    stored = store.save_recurring(
        RecurringSchedule(
            name=name,
            cron=cron,
            timezone=timezone,
            template=template,
            next_slot=current.next_slot if keep and current else schedule.next_after(now),
            max_start_delay=delay_seconds,
            overlap=overlap,
            catch_up=catch_up,
            last_slot=current.last_slot if current else None,
            last_job_id=current.last_job_id if current else None,
            paused=current.paused if current else False,
            created=now,
            updated=now,
        )
    )
    logger.info(
        "recurring schedule %s stored: %r in %s, next at %s",
        name,
        cron,
        timezone,
        stored.next_slot.isoformat(),
        extra={"action": "store_recurring", "schedule": name},
    )
    return stored


def remove_recurring(name: str) -> bool:
    """Delete the schedule ``name``; True if there was one. Its firings stay."""
    if not _could_be_stored(name):
        return False
    return get_job_store().delete_recurring(name)


def list_recurring() -> list[RecurringSchedule]:
    """Every stored schedule, by name; ``next_slot`` is its next firing."""
    return list(get_job_store().list_recurring())


def trigger_recurring(name: str, now: datetime | None = None) -> str:
    """Fire schedule ``name`` now, outside its slots; returns the id of the job in
    charge (the previous firing's, when ``overlap="skip"`` and it still runs).

    Raises:
        UnknownScheduleError: no schedule ``name`` is stored.
    """
    schedule = get_job_store().get_recurring(name) if _could_be_stored(name) else None
    if schedule is None:
        raise UnknownScheduleError(name)
    slot = now or utcnow()
    in_charge, _ = _fire(schedule, slot)
    return in_charge


def fire_due(
    now: datetime | None = None,
    limit: int = 100,
    on_error: Callable[[str, Exception], None] | None = None,
) -> list[str]:
    """Fire the due slots of every schedule not paused; returns the new jobs' ids.

    Safe to run in several processes at once: a slot's job is stored once
    (its id is the slot's), and a schedule's next slot moves by compare-and-set.

    Each schedule fails alone: one that cannot be fired (its expression cannot
    be read here, croniter missing, a template that is no job) keeps its state,
    so it is due again at the next call, and the others fire. Its failure goes
    to ``on_error(name, exc)``; by default it is logged once per schedule and
    cause. An outage of the store or the broker is raised (nothing else could fire).
    """
    now = now or utcnow()
    store = get_job_store()
    fired: list[str] = []
    for schedule in store.due_recurring(now, limit):
        try:
            fired.extend(_fire_due_slots(store, schedule, now))
        except Exception as exc:
            if is_outage(exc):
                raise
            (on_error or _unfired)(schedule.name, exc)
    return fired


def _fire_due_slots(store: IJobStore, schedule: RecurringSchedule, now: datetime) -> list[str]:
    """Fire the due slots of ``schedule`` and move its next slot; the new jobs' ids."""
    fired: list[str] = []
    slots, next_slot = due_slots(
        CronSchedule(schedule.cron, schedule.timezone),
        schedule.next_slot,
        now,
        schedule.catch_up,
    )
    last_job = schedule.last_job_id
    for slot in slots:
        job_id, new = _fire(schedule, slot)
        if new:
            fired.append(job_id)
            last_job = job_id
    moved = schedule.evolve(
        next_slot=next_slot,
        last_slot=slots[-1] if slots else schedule.last_slot,
        last_job_id=last_job,
        updated=now,
    )
    store.advance_recurring(moved)  # False: another process moved it first
    return fired


#: The (schedule, cause) pairs :func:`fire_due` logged already.
_UNFIRED = OnceEach()


def _unfired(name: str, exc: Exception) -> None:
    if _UNFIRED.first((name, cause_of(exc))):
        logger.warning(
            "recurring %s cannot be fired (it stays due; the other schedules fire): %s",
            printable(name),
            printable(str(exc)),
            exc_info=exc,
            extra={"action": "recurring_unfired", "schedule": name},
        )


def _fire(schedule: RecurringSchedule, slot: datetime) -> tuple[str, bool]:
    """Schedule the firing of ``schedule`` at ``slot``.

    Returns the id of the job in charge and whether this call stored it: the
    slot's job (new, or stored by an earlier firing of the same slot), or the
    previous firing still active (``overlap="skip"``)."""
    template = schedule.template
    job = Job.from_record(
        JobRecord(
            id=firing_id(schedule.name, slot),
            channel_id=template["channel_id"],
            category=template.get("category"),
            payload=template["payload"],
            state=with_priority({}, priority_in(template)),
        )
    )
    key = OVERLAP_KEY.format(name=schedule.name) if schedule.overlap == "skip" else None
    try:
        in_charge = JOB_IO.schedule(
            job,
            ScheduleOptions(
                eta=slot,
                max_start_delay=schedule.max_start_delay,
                unique_key=key,
                on_conflict="skip",
            ),
            insert_first=True,
            serve=False,
        )
    except DuplicateJobError:
        return job.id, False  # this slot's job is stored: fired already
    if in_charge != job.id:
        logger.info(
            "recurring %s: slot %s skipped, its previous firing %s is still active",
            schedule.name,
            slot.isoformat(),
            in_charge,
            extra={"action": "skip_overlap", "schedule": schedule.name},
        )
        return in_charge, False
    logger.info(
        "recurring %s fired for %s: job %s",
        schedule.name,
        slot.isoformat(),
        job.id,
        extra={"action": "fire_recurring", "schedule": schedule.name, "job_id": job.id},
    )
    observers.fired(schedule.name, job.id)
    return job.id, True


def _could_be_stored(name: object) -> bool:
    """Whether a schedule row could be named ``name``: a lookup of a name no row can
    hold (too long, a NUL) finds no schedule, without asking the store."""
    try:
        check_name(name)
    except ValueError:
        return False
    return True


def _template(
    job: Job, rate_key: str | None = None, concurrency_key: str | None = None
) -> dict[str, object]:
    """What each firing of ``job`` is made from: its channel, category and payload (with
    ``rate_key`` and ``concurrency_key``, read back by ``Job.from_record`` as a scheduled
    job's are)."""
    record = job.to_record()
    keys = {RATE_KEY_KEY: rate_key, CONCURRENCY_KEY_KEY: concurrency_key}
    given = {name: key for name, key in keys.items() if key is not None}
    if given and record.payload is not None:
        record = record.evolve(payload={**record.payload, **given})
    record = check_job_record(record)
    if record.payload is None:
        raise ValueError(
            f"job {job.id} cannot be a recurring template: each of its tasks needs a "
            "registered executor (use @workflow_task functions), so that workers can "
            "rebuild it from the store"
        )
    return {"channel_id": job.channel_id, "category": job.category, "payload": record.payload}


# -- pause and resume ------------------------------------------------------------------------


def pause_recurring(name: str, now: datetime | None = None) -> bool:
    """Stop schedule ``name`` from firing until :func:`resume_recurring`; True once it
    is paused (also when it was already), False if it kept changing meanwhile.

    The jobs it fired already are left alone; :func:`trigger_recurring` still fires it.

    Raises:
        UnknownScheduleError: no schedule ``name`` is stored.
    """
    return _set_paused(name, True, now or utcnow())


def resume_recurring(name: str, now: datetime | None = None) -> bool:
    """Let schedule ``name`` fire again; True once it is resumed (also when it was not
    paused), False if it kept changing meanwhile.

    The slots that passed while it was paused are not fired (whatever its
    ``catch_up``): it fires next at its first slot after ``now``.

    Raises:
        UnknownScheduleError: no schedule ``name`` is stored.
    """
    return _set_paused(name, False, now or utcnow())


def _set_paused(name: str, paused: bool, now: datetime) -> bool:
    if not _could_be_stored(name):
        raise UnknownScheduleError(name)
    store = get_job_store()
    for _ in range(PAUSE_ATTEMPTS):
        schedule = store.get_recurring(name)
        if schedule is None:
            raise UnknownScheduleError(name)
        if schedule.paused is paused:
            return True
        changed = schedule.evolve(paused=paused, updated=now)
        if not paused and schedule.next_slot <= now:
            changed = changed.evolve(
                next_slot=CronSchedule(schedule.cron, schedule.timezone).next_after(now)
            )
        if store.advance_recurring(changed):  # compare-and-set on the version read
            logger.info(
                "recurring schedule %s %s",
                name,
                "paused" if paused else "resumed",
                extra={
                    "action": "pause_recurring" if paused else "resume_recurring",
                    "schedule": name,
                },
            )
            return True
    return False
