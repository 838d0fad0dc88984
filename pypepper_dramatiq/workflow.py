"""The pypepper.scheduler import path of :mod:`pypepper_dramatiq.model.workflow`."""

from .model.workflow import TIMEOUT_POOL_SIZE, TaskOutcome, Workflow, WorkflowResult

__all__ = ["TIMEOUT_POOL_SIZE", "TaskOutcome", "WorkflowResult", "Workflow"]
