"""The pypepper.scheduler import path of :mod:`pypepper_dramatiq.model.task`."""

from .model.task import Task

__all__ = ["Task"]
