"""The ``pypepper-dramatiq`` command line.

Its names are importable from here, as when it was one module.
"""

from .commands import main

__all__ = ["main"]
