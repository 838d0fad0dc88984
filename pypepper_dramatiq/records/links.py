"""How jobs are linked to the jobs they came from: one definition for the stores and the dashboard.

A job is linked to another when it was scheduled ``after=`` it (kind
:data:`AFTER`), or made by ``Job.retry_saved`` from it (kind :data:`RETRY`, the
original's id in ``payload["retry_of"]``). The stores keep each link when they
insert the child, so that a job's page finds its children through an index
instead of reading every row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..rules.waits import Waits

#: The child was scheduled ``after=`` the parent.
AFTER = "after"
#: The child is a retry of the parent (a Failed or Cancelled job).
RETRY = "retry"
#: Every kind a link may have.
KINDS = (AFTER, RETRY)

#: Key of ``JobRecord.payload`` naming the job a retry was made from.
RETRY_OF_KEY = "retry_of"


@dataclass(frozen=True)
class Link:
    """One link: ``child`` came from ``parent``, as ``kind`` says."""

    parent: str
    child: str
    kind: str


def parents_of(
    job_id: str, payload: Mapping[str, Any] | None, waits: Mapping[str, Any] | None
) -> list[Link]:
    """The links of a job to the jobs it came from, as its row says (retry origin first)."""
    found: list[Link] = []
    origin = (payload or {}).get(RETRY_OF_KEY)
    if isinstance(origin, str) and origin:
        found.append(Link(origin, job_id, RETRY))
    if waits:
        found.extend(Link(parent, job_id, AFTER) for parent in Waits.from_dict(waits).parents)
    return found


def parent_order(link: Link) -> tuple[bool, str]:
    """The order a job's links to its parents are listed in: the retried job first,
    then the parents it waited for, by id."""
    return (link.kind != RETRY, link.parent)


def required_parents(found: Sequence[Link], *, waiting: bool) -> list[str]:
    """Of a new job's links, the parents its insert requires stored: those a waiting
    job waits for (``after=``), whose outcome it needs. A retry's origin may be gone."""
    return [link.parent for link in found if link.kind == AFTER] if waiting else []
