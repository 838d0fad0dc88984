"""What a task may return: a value the job row can store as it is (JSON).

Results are stored in the job row (``state["results"]``) and read back by later
tasks and by callers. A value JSON cannot hold is never replaced by something
else: the attempt that returned it fails with :class:`ResultNotStorableError`.
As with Dramatiq's and Celery's JSON encoders, tuples come back as lists and
dict keys as strings.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ResultNotStorableError
from ..limits.storable import unstorable_in

#: JSON escape of the NUL character, which PostgreSQL's jsonb refuses in text.
_NUL = "\\u0000"


def check_storable(task_name: str, value: Any) -> Any:
    """``value`` if the job row can store it, else :class:`ResultNotStorableError`.

    Refused: objects JSON has no form for (sets, datetimes, custom classes),
    NaN and infinities (not JSON; PostgreSQL refuses them), and text holding
    a NUL character (PostgreSQL's jsonb refuses it) or a lone surrogate (no
    store keeps one: the memory store refuses it too, as every store does).
    """
    try:
        # Not ASCII: a lone surrogate stays itself, a pair stays one character.
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ResultNotStorableError(task_name, value, str(exc)) from None
    if _NUL in text:
        raise ResultNotStorableError(task_name, value, "text with a NUL character")
    surrogate = unstorable_in(text)
    if surrogate is not None:
        raise ResultNotStorableError(task_name, value, f"text with a lone surrogate ({surrogate})")
    return value
