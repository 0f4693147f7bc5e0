"""Query echo: a passage that looks relevant because it repeats the query, not because it answers.

A bi-encoder reranker scores text similarity, so a passage that restates the query, repeats the
question or sprinkles its words rises whatever it says (on human-irrelevant TREC passages, echo
forms written for this project raised the MiniLM score by +0.15 to +0.37; bench/bench_echo.py).
No list of phrasings can catch the next form, so the test is on the class: how much of the
passage's score rests on the query's own words. :func:`mask_query` blanks every word of the
query (and words that begin with one, such as ``#rustprogramming``) out of a passage; the
reranker scores the masked text too, and a passage whose score falls below ``[judge.cascade]
echo_floor`` once the query's words are gone has nothing of its own that the reranker sees as
relevant. The cascade then does not let the reranker call it relevant: it goes to the LLM judge,
whose prompt asks whether the passage answers the query, and its verdict carries the signal
``echo``. Nothing is cut from the passage the judge sees.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["ECHO", "mask_query", "query_terms"]

# The signal a verdict carries when its passage's relevance rested on the query's own words.
ECHO = "echo"
# Function words of English questions: they carry no topic, so they are not masked.
_FUNCTION_WORDS = (
    "a an the of to in on for and or is are was were be been being what who whom whose how why "
    "when where which does do did can could should would will i you your it its this that these "
    "those with by from as at about not no yes there their they he she his her we our me my"
)
_FUNCTION = frozenset(_FUNCTION_WORDS.split())
_WORD = re.compile(r"\w+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u9fff]+")


@lru_cache(maxsize=4096)
def query_terms(query: str) -> tuple[str, ...]:
    """The query's topic words, lower-cased (function words and single characters out), and
    its Chinese character pairs (no spaces in Chinese: a pair is the smallest unit that names
    a topic)."""
    words = {
        w
        for w in _WORD.findall(query.casefold())
        if len(w) > 1 and w not in _FUNCTION and not _CJK.match(w)
    }
    pairs = {run[i : i + 2] for run in _CJK.findall(query) for i in range(len(run) - 1)}
    return tuple(sorted(words | pairs, key=len, reverse=True))


@lru_cache(maxsize=4096)
def _pattern(query: str) -> re.Pattern[str] | None:
    terms = query_terms(query)
    if not terms:
        return None
    latin = [re.escape(t) for t in terms if not _CJK.match(t)]
    cjk = [re.escape(t) for t in terms if _CJK.match(t)]
    parts = [rf"\b(?:{'|'.join(latin)})\w*"] if latin else []
    parts += cjk
    return re.compile("|".join(parts), re.IGNORECASE)


def mask_query(text: str, query: str) -> str:
    """``text`` with the query's topic words (and words starting with one) blanked out."""
    pattern = _pattern(query)
    if pattern is None:
        return text
    return " ".join(pattern.sub(" ", text).split())
