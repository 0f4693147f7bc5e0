"""A scripted judge for coverage and credibility, over the loopback servers' wire.

:func:`aspect_responder` answers each kind of request as a careful judge would on data built so
that the right answer is known: a passage's text is made of fact sentences; nugget creation
lists every distinct sentence of the pooled passages (the first half vital); assignment says
a passage supports a nugget when the nugget's sentence is in it; credibility is "high" for a
``.gov`` / ``.edu`` url, "low" for one on ``example.com`` and "medium" otherwise; relevance
falls to ``relevance`` (default: the hashed yes/no judge). :func:`kind_of` names a request's
kind, for counting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from judge.judging.prompts import MARK
from tests.servers import Answer, Item, Recorded, Responder, hashed_responder


def _users(request: Recorded) -> list[str]:
    """The user messages, read through the datamark between a passage's words."""
    messages = request.messages
    return [str(m.get("content", "")).replace(MARK, " ") for m in messages if m["role"] == "user"]


__all__ = ["aspect_responder", "fenced", "kind_of", "sentences"]

_PASSAGE = re.compile(
    r'<passage id=("(?:[^"\\]|\\.)*")>\n(?:<title>.*?</title>\n)?(.*?)\n</passage>', re.S
)
_NUGGETS = re.compile(r"^(?:Nuggets:|信息点：)\n(.*?)\n<passage", re.M | re.S)
_NUGGET = re.compile(r"^(\S+?)[:：](.*)$", re.M)


def kind_of(request: Recorded) -> str:
    """ "nuggets", "support", "credibility" or "relevance", from the system message."""
    system = " ".join(str(m.get("content", "")) for m in request.messages if m["role"] == "system")
    if '"nuggets": [{"text"' in system:
        return "nuggets"
    if '"supports"' in system:
        return "support"
    if "credib" in system.casefold() or "可信" in system:
        return "credibility"
    return "relevance"


def fenced(request: Recorded) -> list[tuple[str, str]]:
    """(id, text) of each fenced passage in the request's first user message."""
    users = _users(request)
    return [(json.loads(pid), text) for pid, text in _PASSAGE.findall(users[0] if users else "")]


def sentences(text: str) -> list[str]:
    """The fact sentences of a passage: split at full stops (either script)."""
    return [s.strip() for s in re.split(r"(?<=[.。])\s*", text) if s.strip()]


def _nuggets(request: Recorded) -> str:
    found: list[str] = []
    for _, text in fenced(request):
        found += [s for s in sentences(text) if s not in found]
    half = (len(found) + 1) // 2
    items = [
        {"text": s, "importance": "vital" if i < half else "okay"} for i, s in enumerate(found)
    ]
    return json.dumps({"nuggets": items}, ensure_ascii=False)


def _supports(request: Recorded) -> str:
    users = _users(request)
    block = _NUGGETS.search(users[0])
    listed = _NUGGET.findall(block.group(1)) if block else []
    nuggets = [(nid, text.strip()) for nid, text in listed]
    entries = [
        {"id": pid, "nuggets": [nid for nid, fact in nuggets if fact in text]}
        for pid, text in fenced(request)
    ]
    return json.dumps({"supports": entries}, ensure_ascii=False)


def _credibility(request: Recorded) -> str:
    users = _users(request)
    url = re.search(r"URL[:：]\s*(\S+)", users[0] if users else "")
    host = url.group(1) if url else ""
    label = "high" if re.search(r"\.(gov|edu)(/|$)", host) else "medium"
    label = "low" if "example.com" in host else label
    return json.dumps({"reason": f"source {host}", "verdict": label})


_BY_KIND: dict[str, Callable[[Recorded], str]] = {
    "nuggets": _nuggets,
    "support": _supports,
    "credibility": _credibility,
}


def aspect_responder(relevance: Responder | None = None) -> Responder:
    """Answers nuggets, supports and credibility as described above; relevance by ``relevance``."""
    judge = relevance or hashed_responder()

    def respond(request: Recorded) -> Item:
        answer = _BY_KIND.get(kind_of(request))
        return Answer(answer(request)) if answer else judge(request)

    return respond
