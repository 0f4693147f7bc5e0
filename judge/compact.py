"""Many records held at once, in less memory.

Pydantic keeps on every model instance the set of field names it was given
(``__pydantic_fields_set__``): 728 bytes for a set of five names or more, as much as the
record's own values. A run holds a record per passage and per verdict, so at 100,000 passages
these sets alone were about 150 MB. Frozen records never change that set (pydantic adds to it
only on attribute assignment, which a frozen model refuses, and ``model_copy`` copies it before
adding), so records whose sets are equal can share one. :func:`share_fields_sets` makes them
do so; nothing else about the records changes (``model_fields_set``, ``exclude_unset`` dumps
and copies behave as before: tests/test_memo.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from judge.schema import Verdict

__all__ = ["share_fields_sets", "share_verdict_fields"]

# Per record class, the sets shared so far (a class sees a handful of distinct ones).
_SHARED: dict[type[BaseModel], list[set[str]]] = {}


def share_fields_sets(records: Iterable[BaseModel]) -> None:
    """Let each of ``records`` (frozen models) share its fields set with equal ones."""
    for record in records:
        cls = type(record)
        if not cls.model_config.get("frozen"):
            raise TypeError(f"{cls.__name__} is not frozen: its fields set may change")
        own = record.__pydantic_fields_set__
        known = _SHARED.setdefault(cls, [])
        for shared in known:
            if shared == own:
                object.__setattr__(record, "__pydantic_fields_set__", shared)
                break
        else:
            known.append(own)


def share_verdict_fields(verdicts: Iterable[Verdict]) -> None:
    """:func:`share_fields_sets` for verdicts and their usages (a run holds all of them)."""
    verdicts = list(verdicts)
    share_fields_sets(verdicts)
    share_fields_sets(v.usage for v in verdicts)
