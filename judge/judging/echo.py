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

**A restated query counts at half weight.** Masking every query word also takes the topic out of
honest answers, so the floor above must be low. A narrower class: a span that holds most of the
query's topic words together (:func:`restatements`: at least three quarters of them, two at
least, each within :data:`GAP` other words of the next) restates the query, in whatever words
surround it: a heading, "everything about X", "X" repeated between sentences, "the answer to X".
A reranker's score of a passage holding one is ``s_without + RESTATED_WEIGHT * (s_with -
s_without)``, ``s_without`` the score of the passage with its restatements taken out
(:func:`without_restatements`, scored only). Honest answers restate the query too (on the TREC DL
2019 dev pairs, 20% of the relevant passages and 4% of the irrelevant ones do), so dropping the
restatement's share entirely would cost AUC 0.031; half of it costs 0.010 and halves what echo
forms written for the project buy (bench/bench_echo.py). Latin-script queries only: Chinese
restatements are the list layer's (judging/sanitise.py).
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "ECHO",
    "RESTATED_WEIGHT",
    "mask_query",
    "query_terms",
    "restatements",
    "without_restatements",
]

# The signal a verdict carries when its passage's relevance rested on the query's own words.
ECHO = "echo"
# Function words of English questions: they carry no topic, so they are not masked.
_FUNCTION_WORDS = (
    "a an the of to in on for and or is are was were be been being what who whom whose how why "
    "when where which does do did can could should would will i you your it its this that these "
    "those with by from as at about not no yes there their they he she his her we our me my"
)
_FUNCTION = frozenset(_FUNCTION_WORDS.split())
# A word: letters and digits. An underscore separates words, as in a URL slug or an
# identifier ("cost_of_concrete"): the rerankers' tokenizers split there, so echo must too.
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u9fff]+")
# A fragment: text up to a sentence end, ";", "|" or a line break (and that separator).
_FRAGMENT = re.compile(r"[^.!?;|\n]+[.!?;|\n]*")
# A restatement's topic words are at most this many other words apart ("cost of the concrete").
GAP = 2
# The share of a restatement's contribution to a reranker score that is kept.
RESTATED_WEIGHT = 0.5


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
    parts = [rf"(?<![^\W_])(?:{'|'.join(latin)})[^\W_]*"] if latin else []
    parts += cjk
    return re.compile("|".join(parts), re.IGNORECASE)


def mask_query(text: str, query: str) -> str:
    """``text`` with the query's topic words (and words starting with one) blanked out."""
    pattern = _pattern(query)
    if pattern is None:
        return text
    return " ".join(pattern.sub(" ", text).split())


def restatements(text: str, query: str) -> list[tuple[int, int]]:
    """The spans of ``text`` (start, end offsets, in order, apart) that restate the query, said
    together or in pieces; none for a query with fewer than two Latin-script topic words (one
    word cannot be told from a passage naming its subject):

    - *together*: runs of its topic words (a word starting with one counts), each within
      :data:`GAP` other words of the next, that hold at least three quarters of its distinct
      topic words (two at least);
    - *in pieces*: bare fragments (:func:`_bare_fragments`: between sentence ends, ``;``, ``|``
      or line breaks, nothing but topic and function words), when together they hold that
      share: the query's words set apart from the text in twos and threes, as tags, or between
      sentences. None of the dev set's 475 passages says the query so.
    """
    terms = [t for t in query_terms(query) if not _CJK.match(t)]
    if len(terms) < 2:
        return []
    need = max(2, -(-3 * len(terms) // 4))
    words = list(_WORD.finditer(text))
    hits = [_term_of(m.group(0).casefold(), terms) for m in words]
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(words):
        if hits[i] is None:
            i += 1
            continue
        last, seen, k = i, {hits[i]}, i + 1
        while k < len(words) and k - last <= GAP + 1:
            if hits[k] is not None:
                last = k
                seen.add(hits[k])
            k += 1
        if len(seen) >= need:
            spans.append((words[i].start(), words[last].end()))
        i = last + 1
    pieces, said = _bare_fragments(text, terms)
    if len(said) >= need:
        spans = _merged([*spans, *pieces])
    return spans


def _bare_fragments(text: str, terms: list[str]) -> tuple[list[tuple[int, int]], set[str]]:
    """The fragments of ``text`` made of nothing but the query's topic words and function words
    (one topic word at least), and the topic words they hold."""
    spans: list[tuple[int, int]] = []
    said: set[str] = set()
    for fragment in _FRAGMENT.finditer(text):
        words = [m.group(0).casefold() for m in _WORD.finditer(fragment.group(0))]
        hits = [_term_of(w, terms) for w in words]
        if any(h is None and w not in _FUNCTION for w, h in zip(words, hits, strict=True)):
            continue
        found = {h for h in hits if h is not None}
        if found:
            body = fragment.group(0)
            start = fragment.start() + len(body) - len(body.lstrip())
            spans.append((start, fragment.start() + len(body.rstrip())))
            said |= found
    return spans, said


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _term_of(word: str, terms: list[str]) -> str | None:
    return next((t for t in terms if word.startswith(t)), None)


def without_restatements(text: str, query: str) -> str | None:
    """``text`` with its restatements of the query taken out (for a score only, never shown),
    or None when it has none."""
    spans = restatements(text, query)
    if not spans:
        return None
    for start, end in reversed(spans):
        text = f"{text[:start]} {text[end:]}"
    return " ".join(text.split()) or "."
