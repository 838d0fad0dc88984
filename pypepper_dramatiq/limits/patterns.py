"""Limits of job keys by pattern (``{"tenant-*": ...}``): the one rule that
``setup(rate_limits=...)`` and ``setup(concurrency=...)`` share.

Shell-style patterns (:func:`fnmatch.fnmatchcase`); the first that matches a key, in
the order given, applies; each limit is checked when configured, all of them before
any applies.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

#: What a pattern's limit is once checked (a :class:`~.rates.Rate`, an int).
T = TypeVar("T")


class KeyPatterns(Generic[T]):
    """The limits of job keys, by pattern, as ``setting`` declares them (its name
    labels a refusal: ``rate_limits['tenant-*']``)."""

    def __init__(self, setting: str, check: Callable[[object, str], T]) -> None:
        self.setting = setting
        self._check = check
        self._limits: tuple[tuple[str, T], ...] = ()

    def configure(self, limits: Mapping[str, object] | None) -> None:
        """Replace the limits by ``limits`` (None: none), all checked before any applies.

        Raises:
            ConfigError: the check's typed error, naming the pattern of a bad limit;
                the limits in force are kept.
        """
        checked = tuple(
            (str(pattern), self._check(limit, f"{self.setting}[{str(pattern)!r}]"))
            for pattern, limit in (limits or {}).items()
        )
        self._limits = checked

    def of(self, key: str | None) -> T | None:
        """The limit of job key ``key`` (None: no pattern matches, or no key)."""
        if key is None or not self._limits:
            return None
        for pattern, limit in self._limits:
            if fnmatch.fnmatchcase(key, pattern):
                return limit
        return None

    def items(self) -> tuple[tuple[str, T], ...]:
        """The patterns and their limits, in order (for people: the CLI, the dashboard)."""
        return self._limits
