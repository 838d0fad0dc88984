"""The pypepper.scheduler import path of the in-process worker
(:mod:`.drivers.inprocess.worker`)."""

from .drivers.inprocess.worker import Worker

__all__ = ["Worker"]
