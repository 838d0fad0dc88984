"""The Lua scripts of the Redis transport (``scripts/*.lua``, package data), each
registered once per Redis client.

``register_script`` only hashes a script: it is sent to Redis by its first call
(EVALSHA, then SCRIPT LOAD if Redis lacks it), so registering does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from ..per_client import PerClient

#: The scripts, by the name of their file (without ``.lua``).
NAMES = (
    "admit",
    "check",
    "admit_released",
    "admit_and_enqueue",
    "set_bound",
    "ask_start",
    "acquire_slots",
    "renew_slots",
    "slots_held",
)


@cache
def source(name: str) -> str:
    """The text of ``scripts/<name>.lua``."""
    return (files(__package__) / "scripts" / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Scripts:
    """The scripts registered on one client (each a callable ``redis.commands.core.Script``)."""

    admit: Any
    check: Any
    admit_released: Any
    admit_and_enqueue: Any
    set_bound: Any
    ask_start: Any
    acquire_slots: Any
    renew_slots: Any
    slots_held: Any


def _register(client: Any) -> Scripts:
    return Scripts(**{name: client.register_script(source(name)) for name in NAMES})


#: The scripts registered on a Redis client, registered on its first use.
scripts_of: PerClient[Scripts] = PerClient(_register)
