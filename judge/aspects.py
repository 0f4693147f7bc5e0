"""Records for the dimensions beyond relevance: coverage (nuggets) and source credibility.

A *nugget* is an atomic fact a complete answer to a query needs. One fixed nugget set per query
(written by the judge from every engine's pooled passages, or given by people) is shared by
every engine, so coverage is comparable across engines and nights. Per passage, the judge says
which nuggets it supports; ``supports=None`` means that answer could not be read, which is
never the same as "supports nothing".

This is a shared leaf beside ``schema`` (which imports it for ``JudgedQuery``), so it defines
its own frozen base instead of importing ``schema.Record``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NuggetSource = Literal["judge", "human"]
AspectStatus = Literal["ok", "unparsed", "error"]
# The credibility scale's highest grade: 0 low, 1 medium, 2 high (judging/credibility.py).
CREDIBILITY_MAX = 2


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Nugget(_Record):
    """One atomic fact; ``vital`` ones must be in a good answer, the rest are "okay"."""

    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    vital: bool = True


class NuggetSet(_Record):
    """A query's fixed nuggets: one JSONL line in a nugget file a person can read and edit."""

    query_id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    nuggets: tuple[Nugget, ...]
    source: NuggetSource = "judge"
    # The judge model that wrote them (None for human nuggets).
    model: str | None = None


class Support(_Record):
    """Which nuggets one passage supports. ``nuggets`` is None unless ``status == "ok"``."""

    passage_id: str = Field(min_length=1)
    status: AspectStatus
    nuggets: tuple[str, ...] | None = None
    error: str | None = None


class Coverage(_Record):
    """One judged query's nugget set and each passage's support, in the engine's rank order."""

    nuggets: tuple[Nugget, ...]
    supports: tuple[Support, ...]


class Credibility(_Record):
    """The judge's view of one passage's source: a small graded scale with a reason."""

    passage_id: str = Field(min_length=1)
    status: AspectStatus
    grade: int | None = Field(default=None, ge=0, le=CREDIBILITY_MAX)
    reason: str | None = None
    error: str | None = None


class Aspects(_Record):
    """What one unit's coverage and credibility calls gave, before they join its JudgedQuery,
    and their tokens (nugget creation's are the run's, not a unit's: it serves every engine)."""

    coverage: Coverage | None = None
    credibility: tuple[Credibility, ...] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
