"""Coverage (nuggets) and credibility on a set built so that the right answers are known.

The set: TOPICS below, hand-written, each a query and its facts (one short sentence each, the
first half vital). Three engines answer each query with PER_ENGINE passages; a passage states
one or two of the topic's facts and one sentence the query does not ask about, drawn with a
fixed seed so each engine covers a known subset ("broad" draws from every fact, "narrow" from
the first three, "noisy" gives every other passage no fact at all). Each url is a ``.gov`` or
``.edu`` site (an authority) or a content farm. So the nuggets (the facts in the pool), which
passage supports which, each unit's coverage@10 and each source's credibility are known.

A. Cost, against a scripted loopback judge that answers as a careful judge would on this set
   (the nuggets are the pool's facts, a passage supports the facts it states): ``judge run``
   (``run_async``, fresh cache, pointwise relevance, ``[nuggets]`` and ``[credibility]`` on).
   Printed: requests of each kind per query id and per unit, and their prompt / completion
   tokens (cl100k, counted on each request and answer), beside what ``--dry-run`` estimated.

B. ``--embedded``: agreement of the embedded judge (provider "embedded": a 0.5B Qwen on CPU,
   one server, one request at a time) on the first ``--embedded-topics`` topics:
   1. nugget creation from the pool: each written nugget matched to a fact (word-set F1 >=
      0.5); precision (nuggets that are facts) and recall (facts found);
   2. assignment given the true nuggets (as a nugget file would give them): accuracy and
      Cohen's kappa of every (passage, nugget) support against the truth, unparsed share;
   3. coverage@10 of each unit from the judge's own nuggets and supports against the truth:
      mean absolute error, and per topic whether it orders the three engines as the truth does
      (Kendall's tau); seconds per call.
   ``--credibility`` adds the credibility grades against the url kind (high vs low);
   ``--cache FILE`` keeps the embedded judge's answers for a re-run.

Run from the repository root:

    python bench/bench_nuggets.py [--topics 8] [--embedded --embedded-topics 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the loopback server lives in tests/

from judge.aspects import Aspects, Coverage, Nugget, NuggetSet, Support  # noqa: E402
from judge.calling.cache import open_cache  # noqa: E402
from judge.config import load_config  # noqa: E402
from judge.judging.context import EMBEDDED_CONTEXT, count_tokens  # noqa: E402
from judge.judging.dimensions import Dimensions  # noqa: E402
from judge.judging.judge import Judge  # noqa: E402
from judge.metrics.coverage import coverage_at  # noqa: E402
from judge.providers.base import Message  # noqa: E402
from judge.run.estimate import estimate  # noqa: E402
from judge.run.runner import run_async  # noqa: E402
from judge.schema import Passage, Query, SamplingParams  # noqa: E402
from judge.sections import CredibilitySection, NuggetsSection  # noqa: E402
from tests.aspect_wire import fenced, kind_of  # noqa: E402
from tests.servers import Answer, Item, Recorded, ScriptedServer  # noqa: E402

PER_ENGINE = 5
ENGINES = ("broad", "narrow", "noisy")
TOPICS: list[tuple[str, list[str]]] = [
    (
        "what is the rust programming language?",
        [
            "Rust is a systems programming language.",
            "Rust guarantees memory safety without a garbage collector.",
            "Rust was first released as version 1.0 in 2015.",
            "Cargo is the package manager of Rust.",
            "Rust programs compile to native machine code.",
            "Mozilla sponsored the early development of Rust.",
        ],
    ),
    (
        "how is green tea made?",
        [
            "Green tea is made from the leaves of Camellia sinensis.",
            "Green tea leaves are heated soon after picking to stop oxidation.",
            "Japanese green tea is usually steamed.",
            "Chinese green tea is usually pan-fired.",
            "The leaves are rolled and then dried.",
            "Matcha is green tea ground into a fine powder.",
        ],
    ),
    (
        "what causes the tides?",
        [
            "Tides are caused mainly by the gravity of the Moon.",
            "The Sun also pulls on the oceans and changes tide heights.",
            "Most coasts see two high tides every lunar day.",
            "Spring tides happen when the Sun and Moon line up.",
            "Neap tides happen when the Sun and Moon are at right angles.",
            "The shape of a coastline can amplify the tidal range.",
        ],
    ),
    (
        "why do leaves change colour in autumn?",
        [
            "Trees stop making chlorophyll in autumn.",
            "Without chlorophyll the green colour fades from the leaves.",
            "Yellow carotenoids were in the leaves all summer.",
            "Red anthocyanins are produced in autumn from trapped sugars.",
            "Shorter days trigger the change.",
            "Cool sunny weather makes the reds brighter.",
        ],
    ),
    (
        "what is a vaccine?",
        [
            "A vaccine trains the immune system to recognise a pathogen.",
            "Vaccines contain weakened, inactivated or partial forms of a pathogen.",
            "Vaccination leads the body to make memory cells.",
            "Edward Jenner made the first smallpox vaccine in 1796.",
            "Some vaccines need booster doses.",
            "mRNA vaccines give cells instructions to make a viral protein.",
        ],
    ),
    (
        "how does a heat pump work?",
        [
            "A heat pump moves heat instead of generating it.",
            "A refrigerant absorbs heat as it evaporates.",
            "A compressor raises the refrigerant's temperature.",
            "The hot refrigerant releases heat as it condenses.",
            "A reversing valve lets a heat pump cool as well as heat.",
            "Heat pumps can deliver three units of heat per unit of electricity.",
        ],
    ),
    (
        "what is the great barrier reef?",
        [
            "The Great Barrier Reef is the largest coral reef system in the world.",
            "It lies off the coast of Queensland in Australia.",
            "The reef is made of thousands of individual reefs.",
            "It became a World Heritage Site in 1981.",
            "Rising sea temperatures cause coral bleaching on the reef.",
            "The reef can be seen from space.",
        ],
    ),
    (
        "who was ada lovelace?",
        [
            "Ada Lovelace was an English mathematician.",
            "She wrote notes on Charles Babbage's Analytical Engine.",
            "Her notes contain what is seen as the first computer program.",
            "She was the daughter of the poet Lord Byron.",
            "She was born in 1815.",
            "Ada Lovelace Day is held every October.",
        ],
    ),
]
FILLERS = [
    "The museum cafe was closed for renovation that week.",
    "Our newsletter arrives every second Tuesday.",
    "Parking near the station is free after six.",
    "The author also enjoys hiking and photography.",
    "Click here to read more stories like this one.",
    "The harbour was calm on the morning of the festival.",
]
AUTHORITIES = ("https://www.{t}.gov/info", "https://cs.{t}.edu/notes")
FARMS = ("https://best-{t}-tips.example.com/p", "https://{t}.contentfarm.example.com/")


def build(n_topics: int, seed: int = 7) -> tuple[list[Query], dict[str, list[str]]]:
    """Every engine's passages per topic, and each topic's facts (the true nuggets)."""
    rng = random.Random(seed)
    queries, facts = [], {}
    for t, (query, topic_facts) in enumerate(TOPICS[:n_topics]):
        qid = f"t{t}"
        facts[qid] = topic_facts
        for engine in ENGINES:
            choices = topic_facts[:3] if engine == "narrow" else topic_facts
            passages = []
            for i in range(PER_ENGINE):
                stated = (
                    [] if engine == "noisy" and i % 2 else rng.sample(choices, rng.randint(1, 2))
                )
                text = " ".join([*stated, rng.choice(FILLERS)])
                url = rng.choice(AUTHORITIES if rng.random() < 0.5 else FARMS).format(t=qid)
                passages.append(Passage(id=f"{qid}-{engine}-{i}", text=text, url=url))
            queries.append(
                Query(query_id=qid, query=query, engine=engine, passages=tuple(passages))
            )
    return queries, facts


def oracle(facts: dict[str, list[str]]) -> Any:
    """A loopback responder answering as a careful judge would on this set."""
    by_query = {TOPICS[int(qid[1:])][0]: fs for qid, fs in facts.items()}

    def nuggets(shown: list[tuple[str, str]], topic: list[str], _: str) -> Any:
        found = [f for f in topic if any(f in text for _, text in shown)]
        half = (len(found) + 1) // 2
        items = [
            {"text": f, "importance": "vital" if i < half else "okay"} for i, f in enumerate(found)
        ]
        return {"nuggets": items}

    def supports(shown: list[tuple[str, str]], _: list[str], user: str) -> Any:
        listed = re.findall(r"^(n\d+): (.*)$", user, re.M)
        return {
            "supports": [{"id": p, "nuggets": [n for n, f in listed if f in t]} for p, t in shown]
        }

    def credibility(_: list[tuple[str, str]], __: list[str], user: str) -> Any:
        high = re.search(r"\.(gov|edu)/", user) is not None
        return {"reason": "by its site", "verdict": "high" if high else "low"}

    def relevance(shown: list[tuple[str, str]], topic: list[str], _: str) -> Any:
        relevant = bool(shown) and any(f in shown[0][1] for f in topic)
        return {"reason": "states a fact", "verdict": "yes" if relevant else "no"}

    answers = {"nuggets": nuggets, "support": supports, "credibility": credibility}

    def respond(request: Recorded) -> Item:
        user = str(request.messages[-1].get("content", ""))
        topic = next((fs for q, fs in by_query.items() if q in user), [])
        answer = answers.get(kind_of(request), relevance)
        return Answer(json.dumps(answer(fenced(request), topic, user)))

    return respond


def tokens(text: str) -> int:
    return count_tokens([Message(role="user", content=text)]) - 6  # without the framing


def write_inputs(tmp: Path, queries: Sequence[Query], server: ScriptedServer) -> Path:
    data = tmp / "data.jsonl"
    data.write_text("".join(q.model_dump_json(exclude_none=True) + "\n" for q in queries))
    config = tmp / "run.toml"
    config.write_text(
        '[judge]\nprovider = "local"\nmodel = "scripted"\n'
        f'[provider]\nbase_url = "{server.openai_base_url}"\n[dataset]\npath = "{data}"\n'
        f'[run]\ncache = "{tmp / "cache.sqlite"}"\nconcurrency = 8\n'
        "[nuggets]\nenabled = true\n[credibility]\nenabled = true\n"
    )
    return config


def cost(n_topics: int) -> None:
    """Part A: requests and tokens per query id, scripted judge, against the dry run."""
    queries, facts = build(n_topics)
    respond = oracle(facts)
    calls: Counter[str] = Counter()
    prompt: Counter[str] = Counter()
    completion: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp, ScriptedServer(responder=respond) as server:
        config = load_config(write_inputs(Path(tmp), queries, server))
        guess = estimate(config, queries, Path(tmp) / "out")
        asyncio.run(run_async(config, queries, Path(tmp) / "out"))
        for request in server.requests:
            kind = kind_of(request)
            calls[kind] += 1
            messages = [Message(role=m["role"], content=m["content"]) for m in request.messages]
            prompt[kind] += count_tokens(messages)
            answer = respond(request)
            completion[kind] += tokens(answer.text if isinstance(answer, Answer) else str(answer))
    n_ids, n_units = n_topics, n_topics * len(ENGINES)
    print(f"A. scripted judge: {n_ids} query ids x {len(ENGINES)} engines x {PER_ENGINE} passages")
    head = ("calls/id", "calls/unit", "prompt tok/id", "completion tok/id")
    print(f"{'kind':12} {head[0]:>9} {head[1]:>11} {head[2]:>14} {head[3]:>18}")
    for kind in ("nuggets", "support", "credibility", "relevance"):
        print(
            f"{kind:12} {calls[kind] / n_ids:9.2f} {calls[kind] / n_units:11.2f} "
            f"{prompt[kind] / n_ids:14.0f} {completion[kind] / n_ids:18.0f}"
        )
    extra = sum(calls[k] for k in ("nuggets", "support", "credibility"))
    print(
        f"sent: {sum(calls.values())} calls ({extra} for coverage and credibility), "
        f"{sum(prompt.values())} prompt + {sum(completion.values())} completion tokens; "
        f"dry run: {guess.calls} calls {guess.aspect_calls}, ~{guess.prompt_tokens} prompt + "
        f"~{guess.completion_tokens} completion tokens"
    )


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.casefold()))


def _f1(a: str, b: str) -> float:
    x, y = _words(a), _words(b)
    return 2 * len(x & y) / (len(x) + len(y)) if x & y else 0.0


def _kappa(pairs: Sequence[tuple[bool, bool]]) -> float | None:
    n = len(pairs)
    if not n:
        return None
    agree = sum(a == b for a, b in pairs) / n
    pa, pb = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return (agree - chance) / (1 - chance) if chance < 1 else None


def _tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-a of two orderings of the same engines."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    signs = [(a[i] - a[j]) * (b[i] - b[j]) for i, j in pairs]
    return (sum(s > 0 for s in signs) - sum(s < 0 for s in signs)) / len(pairs)


def _truth(query: Query, nuggets: Sequence[Nugget]) -> Aspects:
    supports = tuple(
        Support(
            passage_id=p.id, status="ok", nuggets=tuple(n.id for n in nuggets if n.text in p.text)
        )
        for p in query.passages
    )
    return Aspects(coverage=Coverage(nuggets=tuple(nuggets), supports=supports))


def _true_sets(queries: Sequence[Query], facts: dict[str, list[str]]) -> dict[str, NuggetSet]:
    """Each topic's facts that some engine's passage states, as a given nugget file would."""
    out = {}
    for qid, fs in facts.items():
        texts = [p.text for q in queries if q.query_id == qid for p in q.passages]
        pooled = [f for f in fs if any(f in t for t in texts)]
        nuggets = tuple(
            Nugget(id=f"f{i}", text=f, vital=i < (len(pooled) + 1) // 2)
            for i, f in enumerate(pooled)
        )
        query = next(q.query for q in queries if q.query_id == qid)
        out[qid] = NuggetSet(query_id=qid, query=query, nuggets=nuggets, source="human")
    return out


def _creation_scores(
    written: dict[str, NuggetSet], truth: dict[str, NuggetSet]
) -> tuple[float, float]:
    """Mean precision (written nuggets that are facts) and recall (facts written), by query id."""
    precision, recall = [], []
    for qid, right in truth.items():
        mine = written[qid].nuggets if qid in written else ()
        facts = [n.text for n in right.nuggets]
        hits = [max((_f1(n.text, f) for f in facts), default=0.0) >= 0.5 for n in mine]
        found = [max((_f1(n.text, f) for n in mine), default=0.0) >= 0.5 for f in facts]
        precision.append(sum(hits) / len(hits) if hits else 0.0)
        recall.append(sum(found) / len(found) if found else 0.0)
    return statistics.fmean(precision), statistics.fmean(recall)


async def agreement(n_topics: int, credibility: bool, keep: Path | None) -> None:
    """Part B: the embedded judge against the truth."""
    queries, facts = build(n_topics)
    truth = _true_sets(queries, facts)
    params = SamplingParams(temperature=0.0, max_tokens=16, response_format="json_object")
    with tempfile.TemporaryDirectory() as tmp:
        cache = open_cache(keep or Path(tmp) / "cache.sqlite")
        judge = Judge(
            "embedded",
            "qwen2.5-coder-0.5b-instruct-q4",
            params=params,
            nuggets=NuggetsSection(enabled=True, max_nuggets=8),
            credibility=CredibilitySection(enabled=credibility),
            context_tokens=EMBEDDED_CONTEXT,
            max_reason_words=8,
            cache=cache,
        )
        dims = judge.dimensions
        assert dims is not None and dims.nuggets is not None
        nuggets = dims.nuggets
        try:
            # Starts the local server before the clock does (relevance only: one call).
            await judge.asker.verdicts(
                Query(query_id="w", query="warm-up", passages=(Passage(id="w", text="warm-up"),)), 0
            )
            start = time.perf_counter()
            await dims.prepare(queries)
            made = (time.perf_counter() - start) / len(truth)
            written = dict(nuggets.sets)
            print(f"  nuggets written: {made:.0f} s per query id", file=sys.stderr, flush=True)
            own = {q.key: await _judged(dims, q, "own nuggets") for q in queries}
            nuggets.sets.clear()
            nuggets.failures.clear()
            nuggets.sets.update(truth)
            await dims.prepare(queries)
            start = time.perf_counter()
            given = {q.key: await _judged(dims, q, "true nuggets") for q in queries}
            per_unit = (time.perf_counter() - start) / len(queries)
        finally:
            await judge.aclose()
            cache.close()
    print(
        f"B. embedded judge, {len(truth)} topics x {len(ENGINES)} engines x {PER_ENGINE} passages"
    )
    precision, recall = _creation_scores(written, truth)
    sizes = [len(s.nuggets) for s in written.values()]
    vital = [sum(n.vital for n in s.nuggets) for s in written.values()]
    print(
        f"  nugget creation: precision {precision:.2f}, recall {recall:.2f} of the pooled facts; "
        f"{len(written)}/{len(truth)} sets written, nuggets per set {sizes}, vital {vital}; "
        f"{made:.1f} s per query id"
    )
    _report_assignment(queries, truth, given, per_unit)
    _report_coverage(queries, truth, own)
    if credibility:
        _report_credibility(queries, given)


async def _judged(dims: Dimensions, query: Query, what: str) -> Aspects:
    start = time.perf_counter()
    got = Aspects(**(await dims.judge(query, 0)).results)
    took = time.perf_counter() - start
    print(f"  {what}: {query.query_id}/{query.engine} {took:.0f} s", file=sys.stderr, flush=True)
    return got


def _report_assignment(
    queries: Sequence[Query],
    truth: dict[str, NuggetSet],
    given: dict[tuple[str, str], Aspects],
    per_unit: float,
) -> None:
    pairs: list[tuple[bool, bool]] = []
    unread = total = 0
    for q in queries:
        right = _truth(q, truth[q.query_id].nuggets).coverage
        mine = given[q.key].coverage
        assert right is not None and mine is not None
        for got, want in zip(mine.supports, right.supports, strict=True):
            total += 1
            if got.status != "ok":
                unread += 1
                continue
            ids = [n.id for n in truth[q.query_id].nuggets]
            pairs += [(n in (got.nuggets or ()), n in (want.nuggets or ())) for n in ids]
    accuracy = sum(a == b for a, b in pairs) / len(pairs) if pairs else float("nan")
    kappa = _kappa(pairs)
    shown = "undefined" if kappa is None else f"{kappa:.2f}"
    print(
        f"  assignment given the true nuggets: accuracy {accuracy:.2f}, kappa {shown} over "
        f"{len(pairs)} (passage, nugget) pairs; unparsed {unread}/{total} passages; "
        f"{per_unit:.1f} s per unit"
    )


def _report_coverage(
    queries: Sequence[Query], truth: dict[str, NuggetSet], own: dict[tuple[str, str], Aspects]
) -> None:
    errors: list[float] = []
    taus: list[float] = []
    for qid, right in truth.items():
        units = [q for q in queries if q.query_id == qid]
        mine = [coverage_at(own[q.key], 10) for q in units]
        want = [coverage_at(_truth(q, right.nuggets), 10) for q in units]
        errors += [
            abs(m - w) for m, w in zip(mine, want, strict=True) if m is not None and w is not None
        ]
        if None not in mine and None not in want:
            taus.append(_tau([m or 0.0 for m in mine], [w or 0.0 for w in want]))
    mae = statistics.fmean(errors) if errors else float("nan")
    tau = statistics.fmean(taus) if taus else float("nan")
    unread = sum(
        1
        for q in queries
        if (c := own[q.key].coverage) is None or any(s.status != "ok" for s in c.supports)
    )
    print(f"  own nuggets: {unread} of {len(queries)} units with a support unread", end=";")
    print(
        f"  coverage@10 from its own nuggets: mean absolute error {mae:.2f} over {len(errors)} "
        f"of {len(queries)} units; Kendall tau of the engine order per topic {tau:.2f} over "
        f"{len(taus)} topics"
    )


def _report_credibility(queries: Sequence[Query], given: dict[tuple[str, str], Aspects]) -> None:
    graded = [
        (c.grade, re.search(r"\.(gov|edu)/", p.url or "") is not None)
        for q in queries
        for p, c in zip(q.passages, given[q.key].credibility or (), strict=True)
        if c.grade is not None
    ]
    high = [g for g, authority in graded if authority]
    low = [g for g, authority in graded if not authority]
    print(
        f"  credibility: mean grade {statistics.fmean(high) if high else float('nan'):.2f} for "
        f".gov/.edu urls, {statistics.fmean(low) if low else float('nan'):.2f} for content "
        f"farms ({len(graded)} graded)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=len(TOPICS))
    parser.add_argument("--embedded", action="store_true")
    parser.add_argument("--embedded-topics", type=int, default=3)
    parser.add_argument("--credibility", action="store_true")
    parser.add_argument("--cache", type=Path, help="keep the embedded judge's answers here")
    args = parser.parse_args()
    cost(args.topics)
    if args.embedded:
        asyncio.run(agreement(args.embedded_topics, args.credibility, args.cache))


if __name__ == "__main__":
    main()
