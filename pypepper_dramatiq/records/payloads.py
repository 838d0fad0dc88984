"""A task's parameters as stored: typed values encoded to JSON, decoded by the annotations.

The one definition of a stored payload (``payload["workflows"][w]["tasks"][t]["params"]``):

* :func:`encode_params`, when a :class:`~pypepper_dramatiq.model.task.Task` that is
  stored with its job is made (the producer, on the ``scheduled()`` path): plain JSON
  values are kept as they are (one ``json.dumps``, the check there was before); the
  other values are encoded by what they are, without the task's code, so that a
  producer that names a task by its executor id alone can send them: a dataclass
  as an object of its fields, a pydantic model as its ``model_dump(mode="json")``,
  ``datetime``, ``date`` and ``time`` as ISO 8601 strings, ``Decimal`` and ``UUID``
  as strings, an enum member as its value, tuples and sets as lists.
* :class:`ParamsDecoder`, right before the task function is called (either driver):
  the stored values become what the function's annotations say, read once per
  function (``typing.get_type_hints``) and kept. Keys the function no longer takes
  are dropped (logged once per task and key), missing ones take the function's
  defaults; a required parameter missing, or a value that cannot become its type,
  raises :class:`~pypepper_dramatiq.errors.PayloadError` (not retried: the stored
  bytes will not change). A function taking ``**kwargs`` gets every stored key.

A function whose parameters are plain JSON (or not annotated) costs two set
comparisons a call: the stored dict is passed as it is.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import sys
import threading
import types
import typing
import uuid
from collections import abc
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any

from ..errors import PayloadError, describe
from ..ops.display import printable
from ..ops.isolation import OnceEach
from ..ops.logs import get_logger

__all__ = [
    "ParamsDecoder",
    "UnreadableParams",
    "check_readable",
    "decoder_for",
    "encode_params",
    "encode_value",
    "params_to_store",
    "stored_params",
]

logger = get_logger(__name__)

#: (task, key) pairs already logged as dropped, in this process.
_dropped = OnceEach()
#: (task, parameter) pairs whose annotation could not be read, already logged.
_unannotated = OnceEach()

#: A converter: the stored value and where it sits (``order.lines[0]``) to the typed value.
Converter = Callable[[Any, str], Any]


class _Invalid(Exception):
    """A value that cannot become its annotated type; ``where`` names the place in it."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(reason)
        self.where = where
        self.reason = reason


# -- the stored form -----------------------------------------------------------------


class UnreadableParams(dict[str, Any]):
    """Stored ``params`` that are not a JSON object (a row written by hand or by another
    program): empty, keeping what was stored (``stored``) so that a write of the job
    gives it back unchanged; decoding it raises :class:`PayloadError`."""

    def __init__(self, stored: Any) -> None:
        super().__init__()
        self.stored = stored


def stored_params(value: Any) -> dict[str, Any]:
    """A stored task's ``params`` as the model holds them: the object (absent or null:
    empty), or :class:`UnreadableParams` for anything else."""
    if isinstance(value, dict):
        return value
    if value is None:
        return {}
    return UnreadableParams(value)


def params_to_store(params: dict[str, Any]) -> Any:
    """What a task's ``params`` are written back as (see :class:`UnreadableParams`)."""
    return params.stored if isinstance(params, UnreadableParams) else params


def check_readable(task_name: str, params: dict[str, Any], executor_id: str | None) -> None:
    """Raise :class:`PayloadError` for stored params that are no object
    (:class:`UnreadableParams`): the call of any executor is refused."""
    if isinstance(params, UnreadableParams):
        raise PayloadError(
            task_name,
            None,
            f"are {_shown(params.stored)} (a {_type_name(params.stored)}), not an object",
            executor_id=executor_id,
        )


# -- encoding (by what the value is) -------------------------------------------------


def encode_params(task_name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as stored: the same dict when JSON holds it as it is; else a new one,
    each value encoded (see the module's text).

    Raises:
        PayloadError: (a ``TypeError``) a value that no payload can hold, named with
            its parameter and where in it it sits.
    """
    try:
        json.dumps(params)
    except (TypeError, ValueError):
        pass
    else:
        return params  # the common case: plain JSON, kept as given
    encoded: dict[str, Any] = {}
    for key, value in params.items():
        try:
            encoded[key] = encode_value(value, key)
        except _Invalid as exc:
            raise PayloadError(task_name, key, exc.reason, where=exc.where, encoding=True) from None
    return encoded


def encode_value(value: Any, where: str = "value") -> Any:
    """One value in its stored (JSON) form; ``where`` names it in an error."""
    if isinstance(value, enum.Enum):
        return encode_value(value.value, where)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: encode_value(getattr(value, f.name), f"{where}.{f.name}")
            for f in dataclasses.fields(value)
        }
    if _is_pydantic_model(value):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            stored_key = encode_value(key, f"{where} key")
            if isinstance(stored_key, int) and not isinstance(stored_key, bool):
                stored_key = str(stored_key)  # as JSON writes an int key
            if not isinstance(stored_key, str):
                raise _Invalid(where, f"has a key of type {type(key).__name__}, not a string")
            out[stored_key] = encode_value(item, f"{where}[{stored_key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [encode_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [encode_value(item, f"{where}[...]") for item in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    raise _Invalid(
        where, f"holds a value of type {_type_name(value)}, which a stored payload cannot hold"
    )


def _is_pydantic_model(value: Any) -> bool:
    """A pydantic (v2) model instance; pydantic is looked up only if something imported it."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def _pydantic_model_class(annotation: Any) -> bool:
    pydantic = sys.modules.get("pydantic")
    return (
        pydantic is not None
        and isinstance(annotation, type)
        and issubclass(annotation, pydantic.BaseModel)
    )


def _type_name(value: Any) -> str:
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


# -- decoding (by the annotations) ---------------------------------------------------


class ParamsDecoder:
    """The keyword arguments a task function is called with, from its stored params.

    Built once per function (:func:`decoder_for`): which keywords it takes, which it
    requires, and a converter for each annotated with a type JSON does not hold as it
    is. Thread-safe: it holds no state that a call changes.

    Args:
        fn: the function.
        task_id: the task's stable name (its executor id), for the log and the errors.
        skip: leading positional parameters the caller passes itself (``task``,
            ``context`` of a ``@workflow_task`` function).
    """

    def __init__(self, fn: Callable[..., Any], task_id: str, skip: int = 0) -> None:
        self.task_id = task_id
        try:
            parameters = list(inspect.signature(fn).parameters.values())[skip:]
        except (TypeError, ValueError):  # a builtin without a signature: take all as given
            parameters = []
            self.takes_any = True
        else:
            self.takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
        named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        #: The keywords the function takes.
        self.accepted = frozenset(p.name for p in named)
        #: The keywords it has no default for.
        self.required = frozenset(p.name for p in named if p.default is p.empty)
        hints = _hints(fn, task_id, [p.name for p in named])
        converters = {}
        for p in named:
            converter = _converter(hints.get(p.name, Any))
            if converter is not None:
                converters[p.name] = converter
        #: Per parameter whose annotation asks for more than JSON: how to decode it.
        self.converters: dict[str, Converter] = converters

    def arguments(self, task_name: str, params: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the call: ``params`` itself when nothing is to
        convert, drop or miss; else a new dict.

        Raises:
            PayloadError: the params are no object, a required parameter is missing,
                or a value cannot become its annotated type.
        """
        if type(params) is not dict:
            check_readable(task_name, params, self.task_id)
        keys = params.keys()
        if (
            not self.converters
            and (self.takes_any or keys <= self.accepted)
            and self.required <= keys
        ):
            return params  # plain JSON: as stored
        missing = sorted(self.required.difference(keys))
        if missing:
            raise PayloadError(
                task_name,
                missing[0],
                "is missing: the stored payload has no value for it and it has no default",
                executor_id=self.task_id,
            )
        arguments: dict[str, Any] = {}
        for key, value in params.items():
            if key not in self.accepted and not self.takes_any:
                self._dropped(key)
                continue
            converter = self.converters.get(key)
            if converter is None:
                arguments[key] = value
                continue
            try:
                arguments[key] = converter(value, key)
            except _Invalid as exc:
                raise PayloadError(
                    task_name, key, exc.reason, where=exc.where, executor_id=self.task_id
                ) from None
        return arguments

    def _dropped(self, key: str) -> None:
        if _dropped.first((self.task_id, key)):
            logger.warning(
                "task %s: stored parameter %r is not a parameter of the task any more; "
                "ignored (logged once per task and key)",
                self.task_id,
                key,
                extra={"action": "payload_key_dropped", "task": self.task_id, "key": key},
            )


#: Decoders by function (a function's own attribute would not hold for a bound method).
_decoders: dict[tuple[Any, str, int], ParamsDecoder] = {}
_decoders_lock = threading.Lock()


def decoder_for(fn: Callable[..., Any], task_id: str, skip: int = 0) -> ParamsDecoder:
    """The decoder of ``fn``, built at its first call and kept."""
    key = (fn, task_id, skip)
    found = _decoders.get(key)
    if found is None:
        found = ParamsDecoder(fn, task_id, skip)
        with _decoders_lock:
            found = _decoders.setdefault(key, found)
    return found


def _hints(fn: Callable[..., Any], task_id: str, names: list[str]) -> dict[str, Any]:
    """The annotations of ``fn``'s parameters ``names``, resolved.

    ``typing.get_type_hints`` resolves them all at once; when one of them names
    what the module cannot resolve (often ``task: Task, context: Context``
    imported only under ``TYPE_CHECKING``), each of ``names`` is resolved alone,
    and one that cannot be is passed as stored (logged once per task and parameter).
    """
    target = inspect.unwrap(fn)
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # an annotation naming what its module cannot resolve
        pass
    annotations: dict[str, Any] = getattr(target, "__annotations__", None) or {}
    namespace: dict[str, Any] = getattr(target, "__globals__", None) or {}
    hints: dict[str, Any] = {}
    for name in names:
        annotation = annotations.get(name, Any)
        if not isinstance(annotation, str):
            hints[name] = annotation
            continue
        try:
            hints[name] = eval(annotation, namespace)  # what get_type_hints does, one by one
        except Exception as exc:
            if _unannotated.first((task_id, name)):
                logger.warning(
                    "task %s: the annotation of parameter %r cannot be read (%s); "
                    "it is passed as stored",
                    task_id,
                    name,
                    printable(describe(exc)),
                    extra={"action": "payload_hints_unreadable", "task": task_id},
                )
    return hints


#: Generic origins decoded as a list, a tuple or a set, and as an object.
_SEQUENCES = (
    list,
    tuple,
    set,
    frozenset,
    abc.Sequence,
    abc.MutableSequence,
    abc.Set,
    abc.MutableSet,
    abc.Collection,
    abc.Iterable,
)
_MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)
#: Types JSON holds as they are: no converter.
_PLAIN = (str, int, float, bool, type(None), object)


def _converter(annotation: Any) -> Converter | None:
    """How to decode a value annotated ``annotation``; None: it is passed as stored."""
    if annotation is Any or annotation in _PLAIN or isinstance(annotation, typing.TypeVar):
        return None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _converter(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return _union(args)
    if origin is typing.Literal:
        return None
    if origin in _SEQUENCES:
        return _collection(origin, args)
    if origin in _MAPPINGS:
        return _mapping(args)
    if origin is not None:
        return None  # another generic (a Callable, a Protocol...): as stored
    if not isinstance(annotation, type):
        return None
    if issubclass(annotation, enum.Enum):
        return _enum(annotation)
    if issubclass(annotation, datetime):
        return _iso(datetime)
    if issubclass(annotation, date):
        return _iso(date)
    if issubclass(annotation, time):
        return _iso(time)
    if issubclass(annotation, Decimal):
        return _decimal
    if issubclass(annotation, uuid.UUID):
        return _uuid
    if dataclasses.is_dataclass(annotation):
        return _DataclassConverter(annotation)
    if _pydantic_model_class(annotation):
        return _pydantic(annotation)
    if annotation in (list, tuple, set, frozenset):
        return _collection(annotation, ())
    return None


def _union(args: tuple[Any, ...]) -> Converter | None:
    optional = type(None) in args
    members = [a for a in args if a is not type(None)]
    converters = [_converter(a) for a in members]
    if all(c is None for c in converters):
        return None
    if len(members) == 1:
        only = converters[0]
        assert only is not None

        def optional_one(value: Any, where: str) -> Any:
            return None if value is None and optional else only(value, where)

        return optional_one

    def first_fit(value: Any, where: str) -> Any:
        if value is None and optional:
            return None
        reasons = []
        for member, converter in zip(members, converters, strict=True):
            if converter is None:
                if _fits_plain(member, value):
                    return value
                continue
            try:
                return converter(value, where)
            except _Invalid as exc:
                reasons.append(exc.reason)
        why = f" ({'; '.join(reasons)})" if reasons else ""
        raise _Invalid(where, f"is {_shown(value)}, which fits none of its types{why}")

    return first_fit


def _fits_plain(annotation: Any, value: Any) -> bool:
    if annotation is Any or annotation is object:
        return True
    kind = typing.get_origin(annotation) or annotation
    return isinstance(kind, type) and isinstance(value, kind)


def _collection(origin: Any, args: tuple[Any, ...]) -> Converter | None:
    builder: Callable[[Any], Any]
    if origin in (set, frozenset, abc.Set, abc.MutableSet):
        builder = frozenset if origin is frozenset else set
    elif origin is tuple:
        builder = tuple
    else:
        builder = list
    if origin is tuple and args and args[-1] is not Ellipsis:
        fixed = [_converter(a) for a in args]

        def positions(value: Any, where: str) -> Any:
            items = _list(value, where)
            if len(items) != len(fixed):
                raise _Invalid(where, f"holds {len(items)} items; {len(fixed)} are expected")
            return tuple(
                item if c is None else c(item, f"{where}[{i}]")
                for i, (item, c) in enumerate(zip(items, fixed, strict=True))
            )

        return positions
    item = _converter(args[0]) if args else None
    if item is None and builder is list:
        return None

    def each(value: Any, where: str) -> Any:
        items = _list(value, where)
        if item is None:
            return builder(items)
        return builder(item(v, f"{where}[{i}]") for i, v in enumerate(items))

    return each


def _list(value: Any, where: str) -> list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any]:
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    raise _Invalid(where, f"is {_shown(value)}, not a list")


def _mapping(args: tuple[Any, ...]) -> Converter | None:
    # JSON keys are strings: an int key was stored as its digits.
    key = (_int_key if args[0] is int else _converter(args[0])) if args else None
    item = _converter(args[1]) if len(args) > 1 else None
    if key is None and item is None:
        return None

    def entries(value: Any, where: str) -> Any:
        if not isinstance(value, Mapping):
            raise _Invalid(where, f"is {_shown(value)}, not an object")
        return {
            (k if key is None else key(k, f"{where} key {k!r}")): (
                v if item is None else item(v, f"{where}[{k!r}]")
            )
            for k, v in value.items()
        }

    return entries


def _int_key(value: Any, where: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _Invalid(where, f"is {_shown(value)}, not a whole number") from None


def _enum(kind: type[enum.Enum]) -> Converter:
    def member(value: Any, where: str) -> Any:
        if isinstance(value, kind):
            return value
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in kind)
            why = f"is {_shown(value)}, not a value of {kind.__name__} ({allowed})"
            raise _Invalid(where, why) from None

    return member


def _iso(kind: type[datetime] | type[date] | type[time]) -> Converter:
    word = kind.__name__

    def parse(value: Any, where: str) -> Any:
        if isinstance(value, kind) and (kind is not date or not isinstance(value, datetime)):
            return value
        if not isinstance(value, str):
            raise _Invalid(where, f"is {_shown(value)}, not an ISO 8601 {word} string")
        text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) and kind is not date else value
        try:
            return kind.fromisoformat(text)
        except ValueError:
            raise _Invalid(where, f"is {_shown(value)}, not an ISO 8601 {word}") from None

    return parse


def _decimal(value: Any, where: str) -> Any:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return Decimal(value)
        except InvalidOperation:
            pass
    elif isinstance(value, float):
        return Decimal(repr(value))
    raise _Invalid(where, f"is {_shown(value)}, not a decimal number")


def _uuid(value: Any, where: str) -> Any:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise _Invalid(where, f"is {_shown(value)}, not a UUID")


def _pydantic(model: type[Any]) -> Converter:
    def validate(value: Any, where: str) -> Any:
        if isinstance(value, model):
            return value
        pydantic = sys.modules["pydantic"]
        try:
            return model.model_validate(value)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or 'value'}: {error['msg']}"
                for error in exc.errors()
            )
            raise _Invalid(where, f"is not a valid {model.__name__} ({problems})") from None

    return validate


class _DataclassConverter:
    """A dataclass from its stored object; its fields' plan is read at its first use
    (so that a dataclass may hold itself) and kept."""

    def __init__(self, kind: type[Any]) -> None:
        self.kind = kind
        self._fields: list[tuple[str, bool, Converter | None]] | None = None
        self._names: frozenset[str] = frozenset()

    def _plan(self) -> list[tuple[str, bool, Converter | None]]:
        if self._fields is None:
            try:
                hints = typing.get_type_hints(self.kind, include_extras=True)
            except Exception:  # a field annotation its module cannot resolve: as stored
                hints = {}
            fields = [f for f in dataclasses.fields(self.kind) if f.init]
            self._names = frozenset(f.name for f in fields)
            self._fields = [
                (
                    f.name,
                    f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                    _converter(hints.get(f.name, Any)),
                )
                for f in fields
            ]
        return self._fields

    def __call__(self, value: Any, where: str) -> Any:
        if isinstance(value, self.kind):
            return value
        if not isinstance(value, Mapping):
            raise _Invalid(where, f"is {_shown(value)}, not an object of {self.kind.__name__}")
        fields = self._plan()
        values: dict[str, Any] = {}
        for name, required, converter in fields:
            if name not in value:
                if required:
                    why = f"has no field {name!r}, which {self.kind.__name__} requires"
                    raise _Invalid(where, why)
                continue
            item = value[name]
            values[name] = item if converter is None else converter(item, f"{where}.{name}")
        for extra in value.keys() - self._names:
            if _dropped.first((self.kind, extra)):
                logger.warning(
                    "stored field %r of %s is not a field of it any more; ignored (logged once)",
                    extra,
                    self.kind.__qualname__,
                    extra={"action": "payload_key_dropped", "key": f"{where}.{extra}"},
                )
        try:
            return self.kind(**values)
        except (TypeError, ValueError) as exc:
            raise _Invalid(where, f"cannot make a {self.kind.__name__}: {exc}") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
