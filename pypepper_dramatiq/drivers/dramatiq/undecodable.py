"""Raw data in our queues that is no Dramatiq message: dead-lettered, stranding nothing.

Anything may push into a queue our workers consume (another application sharing
the Redis, a script, a bug): text that is not JSON, a JSON list, an object
without a message's fields, megabytes of bytes. Dramatiq's consumer decodes each
fetched message with the global encoder (``Message.decode``); when that raises,
the ``DecodeError`` leaves the consumer's iterator, the consumer thread logs it
at CRITICAL and starts a new consumer three seconds later, and the messages
fetched with the bad one (the consumer's prefetch, already in this worker's
Redis ack set) are forgotten: they stay in the ack set while the worker lives,
and when it dies they come back with the bad one, which does it all again. (A
whole message naming another queue than the one it sits in is worse: once run, it
is handed to the consumer of the queue it names, and a worker thread dies of a
``KeyError`` when this worker consumes no such queue.)

:class:`GuardedEncoder` wraps whatever encoder was set (``setup()`` installs it
through :func:`install`). In a Dramatiq consumer thread, data the inner encoder
cannot turn into the fields of a message of this queue (:func:`problem`) decodes
to a *placeholder*:
a message of the actor :data:`UNDECODABLE_ACTOR` on the consumer's queue, carrying
a short description of what is wrong (never the data) and, on Redis, the id
under which the data sits in the queue's message hash, found in this consumer's
ack set by comparing the data (:func:`find_redis_id`). The consumer carries on
with its prefetched messages; :class:`UndecodableMiddleware` logs the reason and
fails the placeholder before any actor runs, so Dramatiq rejects it: on Redis
the original bytes move to ``<queue>.XQ`` (kept for the broker's
``dead_message_ttl``), on the stub broker into ``dead_letters_by_queue``.

Good messages decode as before (one check of their fields), and outside a
consumer thread (a results backend, ``AckKeeper``, a script calling
``Message.decode``) the inner encoder is used unchanged.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq import worker as dramatiq_worker
from dramatiq.broker import Broker
from dramatiq.encoder import Encoder, JSONEncoder, MessageData
from dramatiq.errors import DecodeError
from dramatiq.middleware import Middleware

from ...channels.broker import transport_of
from ...errors import MessageError
from ...ops.display import printable
from ...ops.logs import get_logger
from .step_actor import declare_queueless_actor

logger = get_logger(__name__)

#: The actor of the placeholder an undecodable message decodes to; it never runs.
UNDECODABLE_ACTOR = "pypepper_dramatiq.undecodable"
#: The placeholder's option holding what is known of the data (reason, size, excerpt).
OPTION_KEY = "pypepper_undecodable"
#: How much of the data a log line shows (escaped).
EXCERPT_BYTES = 64
#: The longest description of a decoder's error kept.
MAX_REASON = 200
#: How many Redis ids given to placeholders this process remembers (so that two
#: copies of the same bad data in one ack set get one id each).
REMEMBERED_IDS = 1024

#: Dramatiq's message fields (its own definition), those without a default, and the
#: types its consumer and worker rely on: an ``options`` that is no dict, say, fails
#: inside the consumer thread.
_FIELDS = {field.name: field for field in dataclasses.fields(Message)}
_REQUIRED = tuple(
    name
    for name, field in _FIELDS.items()
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
)
_TYPES: dict[str, tuple[type, ...]] = {
    "queue_name": (str,),
    "actor_name": (str,),
    "args": (list, tuple),
    "kwargs": (dict,),
    "options": (dict,),
    "message_id": (str,),
    "message_timestamp": (int, float),
}
_REQUIRED_SET = frozenset(_REQUIRED)
_FIELD_SET = frozenset(_FIELDS)
_TYPE_ITEMS = tuple(_TYPES.items())


def problem(
    fields: Any, *, queue_name: str | None = None, id_option: str | None = None
) -> str | None:
    """What keeps decoded ``fields`` from being a message Dramatiq can handle; None if nothing.

    Args:
        fields: what the encoder returned.
        queue_name: the queue the data was fetched from, which the message must name
            (Dramatiq hands a processed message back to the consumer of the queue it
            names: a worker thread dies on a queue it does not consume).
        id_option: the option naming the message's copy in the broker, which its
            acknowledgement needs (the transport's ``message_id_option``:
            ``redis_message_id`` on Redis), or None when messages carry none.
    """
    if not _plainly_a_message(fields, id_option):
        found = _shape_problem(fields, id_option)
        if found is not None:
            return found
    if queue_name is not None and fields["queue_name"] != queue_name:
        named = fields["queue_name"]
        return printable(f"names queue {named!r}, not {queue_name!r}"[:MAX_REASON])
    return None


def _shape_problem(fields: Any, id_option: str | None) -> str | None:
    if not isinstance(fields, dict):
        return f"decodes to a {type(fields).__name__}, not a message's fields"
    missing = [name for name in _REQUIRED if name not in fields]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    unknown = sorted(repr(name) for name in fields if name not in _FIELDS)
    if unknown:
        shown = ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        return printable(f"unknown field(s) {shown}"[:MAX_REASON])
    for name, kinds in _TYPES.items():
        if name in fields and (
            not isinstance(fields[name], kinds) or isinstance(fields[name], bool)
        ):
            return f"field {name} is a {type(fields[name]).__name__}"
    if id_option is not None and not isinstance(fields["options"].get(id_option), str):
        return f"no {id_option} option"
    return None


def _plainly_a_message(fields: Any, id_option: str | None) -> bool:
    """:func:`problem`'s fast path (a message as an encoder decodes it: exact types),
    taken by every good message a consumer fetches."""
    if type(fields) is not dict or not _REQUIRED_SET <= fields.keys() <= _FIELD_SET:
        return False
    for name, kinds in _TYPE_ITEMS:
        if name in fields and type(fields[name]) not in kinds:
            return False
    return id_option is None or type(fields["options"].get(id_option)) is str


def describe_error(exc: BaseException) -> str:
    """A short description of a decoder's failure (the error it wrapped, when it did).

    Dramatiq's JSON encoder puts the whole data into its ``DecodeError``'s text: the
    error it wraps (``.error``) is what is shown instead.
    """
    cause = exc.error if isinstance(exc, DecodeError) and exc.error is not None else exc
    if isinstance(cause, DecodeError):  # its text holds the data
        return "not decodable: DecodeError"
    return f"not decodable: {_short(cause)}"


def _short(exc: BaseException) -> str:
    text = str(exc)
    if len(text) > MAX_REASON:
        text = text[:MAX_REASON] + "..."
    return printable(f"{type(exc).__name__}: {text}")


def excerpt(data: bytes | str) -> str:
    """The start of ``data`` as escaped text, for a log line."""
    head = data[:EXCERPT_BYTES]
    text = head.decode("utf-8", "backslashreplace") if isinstance(head, bytes) else head
    return printable(text) + ("..." if len(data) > EXCERPT_BYTES else "")


class _GivenIds:
    """The Redis ids recently given to placeholders (bounded), under a lock."""

    def __init__(self) -> None:
        self._ids: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def take_first(self, queue_name: str, candidates: list[str]) -> str | None:
        with self._lock:
            for message_id in candidates:
                if (queue_name, message_id) not in self._ids:
                    self._ids[(queue_name, message_id)] = None
                    while len(self._ids) > REMEMBERED_IDS:
                        self._ids.popitem(last=False)
                    return message_id
        return None


_given = _GivenIds()


def find_redis_id(broker: Any, queue_name: str, data: bytes | str) -> str | None:
    """The id of ``data`` in ``queue_name``'s message hash, among this worker's
    unacknowledged ids of that queue (its ack set), or None if none holds it.

    Each id found is given out once (two copies of the same data get one id each).
    """
    transport = transport_of(broker)
    if transport.message_id_option is None:
        return None
    return _given.take_first(queue_name, transport.find_fetched(queue_name, data))


def placeholder(broker: Any, queue_name: str, data: bytes | str, reason: str) -> MessageData:
    """The fields of the message standing for undecodable ``data`` fetched from ``queue_name``."""
    about: dict[str, Any] = {"reason": reason, "size": len(data), "excerpt": excerpt(data)}
    options: dict[str, Any] = {OPTION_KEY: about}
    id_option = transport_of(broker).message_id_option
    if id_option is not None:
        try:
            redis_id = find_redis_id(broker, queue_name, data)
        except Exception as exc:  # Redis went away between the fetch and this
            redis_id = None
            about["lookup"] = _short(exc)
        about["redis_id"] = redis_id
        # Without the id, the rejection finds nothing to move ("" is in no ack set).
        options[id_option] = redis_id or ""
    return {
        "queue_name": queue_name,
        "actor_name": UNDECODABLE_ACTOR,
        "args": [],
        "kwargs": {},
        "options": options,
    }


#: The class of Dramatiq's consumer threads (``_ConsumerThread`` is its older name).
_CONSUMER_THREAD: Any = getattr(dramatiq_worker, "ConsumerThread", None) or (
    dramatiq_worker._ConsumerThread
)


class GuardedEncoder(Encoder):
    """``inner``, except that a consumer thread never sees it fail: what is no message
    decodes to a placeholder that :class:`UndecodableMiddleware` dead-letters.

    Args:
        inner: the encoder that was set (Dramatiq's JSON one unless you chose another).
            Without one, Dramatiq's JSON encoder: code that makes a new encoder of the
            installed encoder's class (``type(dramatiq.get_encoder())()``, as
            Dramatiq's own tests do) gets a working one.
    """

    def __init__(self, inner: Encoder | None = None) -> None:
        self.inner = inner if inner is not None else JSONEncoder()

    def encode(self, data: MessageData) -> bytes:
        encoded: bytes = self.inner.encode(data)
        return encoded

    def decode(self, data: bytes) -> MessageData:
        thread: Any = threading.current_thread()
        if not isinstance(thread, _CONSUMER_THREAD):
            fields: MessageData = self.inner.decode(data)
            return fields
        broker = thread.broker
        try:
            fields = self.inner.decode(data)
        except Exception as exc:
            reason = describe_error(exc)
        else:
            found = problem(
                fields,
                queue_name=thread.queue_name,
                id_option=transport_of(broker).message_id_option,
            )
            if found is None:
                return fields
            reason = found
        return placeholder(broker, thread.queue_name, data, reason)


def _never_runs() -> None:
    """The placeholder actor: its messages are failed before any actor runs."""
    raise MessageError("an undecodable message reached its actor; UndecodableMiddleware is missing")


class UndecodableMiddleware(Middleware):
    """Fails each placeholder (Dramatiq then dead-letters it) and logs why."""

    def before_process_message(self, broker: Broker, message: Any) -> None:
        if message.actor_name != UNDECODABLE_ACTOR:
            return
        about = message.options.get(OPTION_KEY)
        about = about if isinstance(about, dict) else {}
        reason = printable(str(about.get("reason", "unknown")))
        excerpt_text = printable(str(about.get("excerpt", "")))
        redis_id = about.get("redis_id")
        queue_name = printable(str(message.queue_name))
        extra = {
            "action": "dead_letter_undecodable",
            "queue": queue_name,
            "message_id": redis_id,
            "reason": reason,
            "size": about.get("size"),
        }
        if transport_of(broker).message_id_option is not None and not redis_id:
            logger.error(
                "undecodable message on queue %s (%s bytes, starting %s): %s; its id was not "
                "found in this worker's ack set (%s): it stays there, and comes back (to be "
                "dead-lettered then) once this worker has stopped",
                queue_name,
                about.get("size"),
                excerpt_text,
                reason,
                printable(str(about.get("lookup", "no id holds this data"))),
                extra=extra,
            )
        else:
            logger.error(
                "dead-lettering undecodable message %s on queue %s (%s bytes, starting %s): %s",
                printable(str(redis_id or message.message_id)),
                queue_name,
                about.get("size"),
                excerpt_text,
                reason,
                extra=extra,
            )
        error = MessageError(f"undecodable message on queue {queue_name}: {reason}")
        message.stuff_exception(error)
        message.fail()


def install(broker: Broker) -> None:
    """Guard ``broker``'s consumers against undecodable messages (once per broker).

    Wraps the global encoder (unless it is wrapped already: set your own encoder
    before calling ``setup()``), adds :class:`UndecodableMiddleware` and declares
    the placeholder actor (no queue of its own).
    """
    encoder = dramatiq.get_encoder()
    if not isinstance(encoder, GuardedEncoder):
        dramatiq.set_encoder(GuardedEncoder(encoder))
    if not any(isinstance(m, UndecodableMiddleware) for m in broker.middleware):
        broker.add_middleware(UndecodableMiddleware())
    declare_queueless_actor(broker, _never_runs, UNDECODABLE_ACTOR, {})
