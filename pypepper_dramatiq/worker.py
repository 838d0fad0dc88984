"""The pypepper.scheduler import path of the in-process worker (:mod:`.inprocess.worker`)."""

from .inprocess.worker import Worker

__all__ = ["Worker"]
