"""The Lua scripts of the Redis transport (``scripts/*.lua``, package data), each
registered once per Redis client.

``register_script`` only hashes a script: it is sent to Redis by its first call
(EVALSHA, then SCRIPT LOAD if Redis lacks it), so registering does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

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
    "release_slots",
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
    release_slots: Any


def _register(client: Any) -> Scripts:
    return Scripts(**{name: client.register_script(source(name)) for name in NAMES})


#: The scripts registered on a Redis client, registered on its first use.
scripts_of: PerClient[Scripts] = PerClient(_register)


def call_script(script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """``script(keys=keys, args=args)`` through fewer of redis-py's layers: EVALSHA
    sent on a connection of the client's pool, and its answer read.

    A client call wraps every command in layers (its retry loop, a checkout per
    command name, the script's own checks) that cost about 18 us of CPU a call,
    a third of the round trip's: ``scheduled()`` pays it once a job. The command
    is packed here (:func:`_packed`), not by redis-py's packer. Whatever is
    not the plain case takes the script's own call, which does what it always
    did: a client holding one connection, Redis lacking the script (loaded, then
    run), a connection that failed (reconnected and the command sent again, as
    redis-py's retries send it).
    """
    client = script.registered_client
    if getattr(client, "connection", None) is not None:  # a single-connection client
        return script(keys=keys, args=args)
    pool = client.connection_pool
    try:
        connection = pool.get_connection()
    except (RedisConnectionError, RedisTimeoutError):
        return script(keys=keys, args=args)
    try:
        connection.send_packed_command([_packed(connection, script.sha, keys, args)])
        return connection.read_response()
    except NoScriptError:
        pass
    except (RedisConnectionError, RedisTimeoutError):
        connection.disconnect()
    finally:
        pool.release(connection)
    return script(keys=keys, args=args)


def _packed(connection: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """EVALSHA of ``sha`` with ``keys`` and ``args`` in Redis's protocol, as redis-py
    packs it (strings in the connection's encoding), in one buffer.

    redis-py's packer asks its encoder the type of every argument and formats the
    buffer anew for each: about 6 us of CPU for the eleven arguments of one job,
    against 2.5 here.
    """
    encoder = connection.encoder
    parts = [b"*%d\r\n$7\r\nEVALSHA\r\n" % (len(keys) + len(args) + 3)]
    for value in (sha, len(keys), *keys, *args):
        if isinstance(value, str):
            value = value.encode(encoder.encoding, encoder.encoding_errors)
        elif not isinstance(value, bytes):
            value = encoder.encode(value)  # a number: as redis-py writes it
        parts.append(b"$%d\r\n%s\r\n" % (len(value), value))
    return b"".join(parts)
