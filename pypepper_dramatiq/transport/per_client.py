"""One object per connection in this process: a batcher, a set of registered scripts.

Each is made on the connection's first use and forgotten with it (a weak reference),
so a connection that is closed and dropped takes its batcher or scripts along.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["PerClient"]

T = TypeVar("T")


class PerClient(Generic[T]):
    """``of(client)``: the one ``T`` of ``client``, made by ``make(client)`` on first use.

    Two threads asking for a new client's object at once get the same one.
    """

    def __init__(self, make: Callable[[Any], T]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, client: Any) -> T:
        found = self._made.get(client)
        if found is None:
            with self._lock:
                found = self._made.get(client)
                if found is None:
                    found = self._made[client] = self._make(client)
        return found
