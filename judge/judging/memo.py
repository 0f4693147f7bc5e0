"""A query's verdicts remembered whole, so a cached re-run reads one record per query.

A re-run whose every answer is cached gives each query the same verdicts it gave last time:
they are a pure function of the query, its passages, the judge's settings and code, and the
stored answers. So once a query's verdicts all came from the cache, they are stored together,
with the query's passages as the judge saw them where sanitising or the context window changed
them, in the cache file's ``verdict_sets`` table (zlib-compressed JSON). The next run reads
that one record instead of fitting, keying, looking up, reading and tallying every passage: at
100,000 judgments that was most of a cached re-run's time.

The key covers everything the verdicts depend on besides the stored answers: the judge
version and the source of the modules that sanitise, fit, ask, parse and build the records;
the asker's identity (its prompts' shared digests, the parser's tag, mode, re-asking); the
provider's identity; the sanitising and context settings; the repeat; and every field of the
query text and its passages. A set holds what a cached re-run would give: verdicts that were all
``ok`` and all read from the cache; after fresh calls (whose attempts and latency a re-run
would not repeat), the verdicts read back from the cache at once, when every first-round
answer is there (pointwise; a listwise judge's sets are written by its first cached re-run).
Only a plain judge keeps sets: a cascade, a rerank provider or coverage and credibility
have inputs of their own, and go the long way. Clearing or pruning the cache drops every set
(any answer gone may be one of theirs, and each judge version keys its own, so a prune is what
clears an older version's), and so does replacing an answer under its key. A set that does not
read back as this query's verdicts (another version's, or a damaged row) is ignored.
"""

from __future__ import annotations

import hashlib
import operator
import zlib
from collections.abc import Awaitable, Callable, Sequence

from pydantic import Field, TypeAdapter, ValidationError

from judge import schema
from judge.calling.caller import Caller
from judge.judging import ask, context, relevance, sanitise, verdicts
from judge.judging.keys import code_digest
from judge.schema import Passage, Query, Record, Verdict, share_verdict_fields

SCHEME = "judge-verdict-set-1"
_FIELDS = operator.attrgetter(*Passage.model_fields)


class _Set(Record):
    verdicts: tuple[Verdict, ...]
    # The passages the judge saw, by position, where they differ from the query's.
    fitted: dict[int, Passage] = Field(default_factory=dict)


_READ = TypeAdapter(_Set)


def _from_cache(verdict: Verdict) -> bool:
    """Whether a cached re-run gives ``verdict`` as it is: read from the cache, or a blank
    passage's, which no call gives."""
    return verdict.cached or verdict.source == "empty"


class VerdictMemo:
    """Whole queries' verdicts in the cache, keyed by what decides them."""

    def __init__(self, caller: Caller, identity: str) -> None:
        self.caller = caller
        code = code_digest((ask, relevance, context, sanitise, verdicts, schema))
        chat = caller.chat.identity if caller.chat is not None else ""
        self._base = hashlib.sha256(f"{SCHEME}\x00{code}\x00{chat}\x00{identity}\x00".encode())

    async def verdicts(
        self,
        query: Query,
        repeat: int,
        fit: Callable[[Query], Query],
        ask: Callable[[Query, int], Awaitable[list[Verdict]]],
        reread: Callable[[Query, int], list[Verdict] | None],
    ) -> tuple[Query, list[Verdict]]:
        """``query`` as the judge saw it (``fit``) and its verdicts: read whole when stored, else
        ``ask``ed. Then stored: as asked when they all came from the cache; after fresh calls,
        as ``reread`` from the cache (what a cached re-run would give, None when some answer
        is not there: an unparsed first answer, a listwise judge)."""
        key = self.key(query, repeat)
        found = self.get(key, query)
        if found is not None:
            return found
        fitted = fit(query)
        asked = await ask(fitted, repeat)
        if all(v.status == "ok" for v in asked):
            kept = asked if all(map(_from_cache, asked)) else reread(fitted, repeat)
            if kept is not None:
                self.put(key, query, fitted, kept)
        return fitted, asked

    def key(self, query: Query, repeat: int) -> str:
        """The key of ``query``'s verdicts for ``repeat``."""
        # repr: unambiguous for the str, None, number and tuple values a Passage holds.
        values = (repeat, query.query, [_FIELDS(p) for p in query.passages])
        h = self._base.copy()
        h.update(repr(values).encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def get(self, key: str, query: Query) -> tuple[Query, list[Verdict]] | None:
        """The query as the judge saw it and its verdicts, when a set is stored under ``key``
        for exactly these passages; None otherwise."""
        blob = self.caller.cache.get_verdict_set(key)
        if blob is None:
            return None
        try:
            found = _READ.validate_json(zlib.decompress(blob))
        except (zlib.error, ValidationError):
            return None
        ids = [p.id for p in query.passages]
        if [v.passage_id for v in found.verdicts] != ids or any(
            not 0 <= i < len(ids) or found.fitted[i].id != ids[i] for i in found.fitted
        ):
            return None
        if found.fitted:
            fitted = tuple(found.fitted.get(i, p) for i, p in enumerate(query.passages))
            query = query.model_copy(update={"passages": fitted})
        share_verdict_fields(found.verdicts)
        hits = sum(v.source != "empty" for v in found.verdicts)  # blank: no answer to hit
        self.caller.stats.cache_hits += hits
        self.caller.cache.hits += hits
        return query, list(found.verdicts)

    def put(self, key: str, query: Query, fitted: Query, found: Sequence[Verdict]) -> None:
        """Store ``found`` (``query``'s verdicts as judged from ``fitted``) under ``key``, when
        every one is ``ok`` and was read from the cache."""
        if not all(v.status == "ok" and _from_cache(v) for v in found):
            return
        changed = {
            i: p
            for i, (p, q) in enumerate(zip(fitted.passages, query.passages, strict=True))
            if p != q
        }
        value = _Set(verdicts=tuple(found), fitted=changed)
        blob = zlib.compress(value.model_dump_json(exclude_defaults=True).encode("utf-8"), 1)
        self.caller.cache.put_verdict_set(key, blob)
