"""The seed's import path for the in-process worker: :mod:`pypepper_dramatiq.inprocess.worker`."""

from .inprocess.worker import Worker

__all__ = ["Worker"]
