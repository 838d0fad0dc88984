"""The pypepper.scheduler import path of :mod:`pypepper_dramatiq.rules.status`."""

from .rules.status import TERMINAL, Status, may_overwrite, overwritable_by

__all__ = ["Status", "TERMINAL", "may_overwrite", "overwritable_by"]
