"""The import paths of pypepper.scheduler's API keep exporting what they exported.

The package's modules sit in families (``model/``, ``rules/``, ``engine/``, ...); the
paths users of the seed wrote (``pypepper_dramatiq.job``, ``.status``, ...) stay as
re-exports. The names are frozen here as they were before the move.
"""

from __future__ import annotations

import configparser
import importlib
from pathlib import Path

import pytest

import pypepper_dramatiq

ROOT = Path(__file__).resolve().parents[2]

#: Each seed path and the public names it exported before the relayout.
SEED_EXPORTS: dict[str, list[str]] = {
    "channel": ["POLL_INTERVAL", "Channel", "ChannelConnector", "ChannelManager", "SendResult",
                "manager"],
    "executor": ["TaskFunction", "FinalFailureHook", "ASYNC_POLL_INTERVAL",
                 "ASYNC_CLEANUP_SECONDS", "IExecutor", "running_job", "run_awaitable",
                 "CallableExecutor", "ExecutorRegistry", "executor_registry"],
    "job": ["CANCEL_EVENT_KEY", "Job", "chain", "Scheduled", "SAVE_ATTEMPTS", "CANCEL_ATTEMPTS",
            "IJobIO", "use_job_io"],
    "task": ["Task"],
    "worker": ["Worker"],
    "workflow": ["TIMEOUT_POOL_SIZE", "TaskOutcome", "WorkflowResult", "Workflow"],
    "store": ["BACKENDS", "IJobStore", "JobRecord", "PersistenceWarning", "configure_job_store",
              "get_job_store", "reset_job_store", "set_job_store", "setup_from_config"],
    "config": ["Config", "config", "section", "seconds", "DURATION_UNITS", "DURATION_WORDS",
               "DURATION_FORMS", "duration", "count", "check_choice"],
    "errors": ["PypepperError", "InvalidTransitionError", "ChannelEnqueueError",
               "ChannelFullError", "ChannelStoppedError", "BrokerUnavailableError",
               "JobRequeuedError", "JobRedeliveryError", "UnknownJobError", "DuplicateJobError",
               "WaitTimeoutError", "WaitInsideJobError", "RetryError", "JobNotRetriableError",
               "UnknownTaskError", "UnknownScheduleError", "NonRetriableError",
               "ResultNotStorableError", "TaskCancelledError", "JobCancellationError",
               "AmbiguousTaskNameError", "NoTaskResultError", "ExecutorError",
               "UnknownExecutorError", "ConfigError", "StoreError", "StoreUnavailableError",
               "StoreDataError", "CorruptRecordError", "CorruptScheduleError",
               "SchemaVersionError", "StoreNotConfiguredError", "MessageError", "is_retriable",
               "cancels_job", "describe", "TaskTimeoutError", "retry_may_cure"],
    "status": ["Status", "TERMINAL", "may_overwrite", "overwritable_by"],
    "events": ["Event", "INIT", "SCHEDULE", "RUN", "COMPLETE", "FAIL", "CANCEL", "TRANSITIONS",
               "transition", "SchedulerFSM", "build_scheduler_fsm"],
    "dashboard": ["basic_auth", "make_app"],
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(SEED_EXPORTS))
def test_the_seed_path_exports_its_names(path: str) -> None:
    module = importlib.import_module(f"pypepper_dramatiq.{path}")
    missing = [name for name in SEED_EXPORTS[path] if not hasattr(module, name)]
    assert missing == [], f"pypepper_dramatiq.{path} lost {missing}"


@pytest.mark.parametrize("path", sorted(SEED_EXPORTS))
def test_the_seed_path_gives_the_package_s_own_objects(path: str) -> None:
    """A name also exported by the package is the same object, not a copy."""
    module = importlib.import_module(f"pypepper_dramatiq.{path}")
    shared = [n for n in SEED_EXPORTS[path] if n in pypepper_dramatiq.__all__]
    different = [n for n in shared if getattr(module, n) is not getattr(pypepper_dramatiq, n)]
    assert different == []


def test_the_console_entry_point_resolves_to_the_command_line() -> None:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    scripts = parser["options.entry_points"]["console_scripts"].strip().splitlines()
    name, _, target = (part.strip() for part in scripts[0].partition("="))
    assert (name, target) == ("pypepper-dramatiq", "pypepper_dramatiq.cli:main")
    module, _, attribute = target.partition(":")
    main = getattr(importlib.import_module(module), attribute)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
