"""The pypepper.scheduler import path for the process-wide job store (:mod:`.stores.registry`)."""

from .stores import registry
from .stores.registry import *  # noqa: F403 (a thin re-export of the registry's names)

__all__: list[str] = []
__all__ += registry.__all__
