"""A memory store whose writes can be made to fail on cue (the store-down path, in-process).

Real outages of a real PostgreSQL are exercised by the integration tests; this
one lets a unit test fail exactly the write a rule is about.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pypepper_dramatiq.errors import StoreUnavailableError
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.memory import MemoryJobStore

Hook = Callable[[JobRecord], "bool | None"]


class ScriptedStore(MemoryJobStore):
    """``fail(status, times, how)`` makes the next ``times`` puts of ``status`` fail."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[tuple[Status, bool]] = []
        self._failures: dict[Status, list[str]] = {}
        self.before_put: Hook | None = None
        self.gets_fail = 0
        self._script_lock = threading.Lock()

    def fail(self, status: Status, times: int = 1, how: str = "raise") -> None:
        """``how``: "raise" (store down) or "false" (write rejected)."""
        with self._script_lock:
            self._failures.setdefault(status, []).extend([how] * times)

    def put(self, record: JobRecord) -> bool:
        return self._scripted(record, super().put)

    def advance(self, record: JobRecord) -> bool:
        # The engine records steps with advance: scripted and logged like a put.
        return self._scripted(record, super().advance)

    def _scripted(self, record: JobRecord, write: Callable[[JobRecord], bool]) -> bool:
        if self.before_put is not None:
            self.before_put(record)
        with self._script_lock:
            pending = self._failures.get(record.status)
            how = pending.pop(0) if pending else None
        if how == "raise":
            self.puts.append((record.status, False))
            raise StoreUnavailableError(f"scripted outage writing {record.status.value}")
        if how == "false":
            self.puts.append((record.status, False))
            return False
        ok = write(record)
        self.puts.append((record.status, ok))
        return ok

    def get(self, job_id: str) -> JobRecord | None:
        with self._script_lock:
            if self.gets_fail > 0:
                self.gets_fail -= 1
                raise StoreUnavailableError("scripted outage reading")
        return super().get(job_id)

    def written(self) -> list[Status]:
        """Statuses of the successful writes, in order."""
        return [status for status, ok in self.puts if ok]
