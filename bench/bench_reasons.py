"""Do the LLM judge's reasons say what its verdicts say? Reason/verdict consistency per variant.

Judges a small stratified sample of English pairs (the TREC DL 2019 dev set) and Chinese pairs
(bench/data/zh_relevance.jsonl) with a config's LLM alone (no cascade, no reranker), once per
``--variant NAME KEY=VALUE...`` (config overrides: ``judge.verdict_first=false``,
``judge.params.max_tokens=48``, ``judge.template_dir=DIR`` for another set of templates), and
reads each reason's stance with :func:`stance`, a small rule-based reader (below). Printed per
variant, language and split (queries split by a hash of their id into ``tune`` and
``held-out``: choose a fix on tune, report held-out):

- ``yes->neg``: the share of "yes" verdicts whose reason says the passage is not relevant;
- ``no->pos``: the share of "no" verdicts whose reason says it is relevant;
- ``instr``: the share of reasons about instructions / untrusted text, not relevance;
- ``unclear``: reasons the reader gives no stance (empty, cut off, or neither way);
- ``cut``: answers cut off by ``max_tokens`` (their reason is a fragment);
- AUC of P(relevant) against gold (grade >= 2), and seconds per passage.

``--dump FILE`` writes every pair's reason, verdict and stance (JSONL) for hand-labelling;
``--labels FILE`` (JSONL ``{variant, lang, key, stance}``, labelled by hand) prints the
reader's agreement with those labels.

    python bench/bench_reasons.py configs/cascade.toml --en-pairs 30 --zh-pairs 20 \\
        --variant before --variant after judge.verdict_first=false judge.params.max_tokens=64 \\
        --cache /tmp/reasons.sqlite --dump reasons.jsonl

The embedded 0.5B judge takes 3-10 s a passage on 2 busy cores: 50 pairs a variant is
about 5 minutes; ``--cache`` keeps answers between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from bench_quality import Pair, as_queries, judge_queries, read_pairs, stratified_sample

from judge.analysis.reliability import roc_auc
from judge.calling.cache import open_cache
from judge.calling.limits import Limits
from judge.config import load_config, parse_override
from judge.judging.judge import Judge
from judge.schema import Verdict

EN_PAIRS = Path(__file__).resolve().parents[2] / "shared" / "data" / "trec-dl-2019-sample.jsonl"
ZH_PAIRS = Path(__file__).resolve().parent / "data" / "zh_relevance.jsonl"

Stance = Literal["relevant", "not_relevant", "instructions", "unclear"]
STANCES: tuple[Stance, ...] = ("relevant", "not_relevant", "instructions", "unclear")

# ---- the stance reader ----------------------------------------------------------------------
#
# A reason's stance, by three ordered lists of cues (first match wins):
#   1. instructions: the reason talks about instructions, commands, prompts, untrusted or
#      low-quality text: the judge's injection defence, not the passage's topic (the datamark
#      "^" is no cue: a reason quoting the passage copies its marks);
#   2. not_relevant: a negation of answering or relevance ("does not provide", "irrelevant",
#      "没有提到", "无关"), or an answer that is only about something else ("only mentions");
#   3. relevant: a claim the passage answers, explains, gives or mentions something, or is
#      relevant ("provides", "explains", "说明", "提到", "相关").
# Negation is read before the positive cues because a negated reason nearly always carries a
# positive verb too ("does not provide"). Nothing matched, or an empty reason: unclear.
# English is matched on lowercased words; Chinese on characters (no word boundaries).

_EN_INSTR = re.compile(
    r"\b(instruct\w*|command\w*|directive\w*|prompt\w*|untrusted|low[- ]quality|"
    r"inject\w*|jailbreak\w*|ignore[sd]?|datamark\w*)\b"
)
_EN_NEG = re.compile(
    r"\b(not|no|never|nothing|neither|nor|none|irrelevant|unrelated|lacks?|lacking|fails?|"
    r"without|doesn't|don't|isn't|aren't|cannot|can't|only\s+(mentions?|talks?|discuss\w*)|"
    r"instead|rather\s+than|off[- ]topic)\b"
)
_EN_POS = re.compile(
    r"\b(provides?|answers?|explains?|describes?|mentions?|states?|defines?|lists?|gives?|"
    r"contains?|discuss\w*|includes?|relevant|related|helps?|addresses|covers?|shows?|"
    r"details?|specif\w*|directly|information|identif\w*|tells?|says?)\b"
)
_ZH_INSTR = re.compile(r"指令|命令|指示|提示词|下达|质量低|低质量|不可信|忽略|注入")
_ZH_NEG = re.compile(
    r"没有|没提|并未|未提|未涉及|未说明|未给出|未回答|未包含|不是|无关|不相关|不能|无法|不涉及|"
    r"不包含|不包括|不提供|不回答|不符|缺乏|缺少|只提到|仅提到|只是|而非|而不是|不够"
)
_ZH_POS = re.compile(
    r"提供|回答|说明|解释|介绍|描述|提到|提及|包含|给出|列出|相关|帮助|直接|指出|讲述|涉及|"
    r"阐述|定义|明确|具体|答案"
)
_CJK = re.compile(r"[\u4e00-\u9fff]")


def stance(reason: str | None) -> Stance:
    """What a reason says about relevance (see the cue lists above); the language by script."""
    text = (reason or "").strip().lower()
    if not text:
        return "unclear"
    if _CJK.search(text):
        rules = ((_ZH_INSTR, "instructions"), (_ZH_NEG, "not_relevant"), (_ZH_POS, "relevant"))
    else:
        rules = ((_EN_INSTR, "instructions"), (_EN_NEG, "not_relevant"), (_EN_POS, "relevant"))
    for pattern, said in rules:
        if pattern.search(text):
            return said  # type: ignore[return-value]
    return "unclear"


# ---- judging --------------------------------------------------------------------------------


def split_of(query_id: str) -> str:
    """``tune`` or ``held-out``, by a stable hash of the query id."""
    return "tune" if hashlib.blake2b(query_id.encode()).digest()[0] % 2 == 0 else "held-out"


async def judge_variant(
    config_path: Path, sets: Sequence[str], cache: Path, pairs: list[Pair], lang: str
) -> tuple[dict[str, Verdict], float]:
    overrides = dict(parse_override(s) for s in [*sets, f"judge.language={lang}"])
    config = load_config(config_path, overrides)
    # The LLM alone: what it is asked is what is measured.
    config = config.model_copy(update={"judge": config.judge.model_copy(update={"cascade": None})})
    config = config.model_copy(update={"rerank": None})
    judge = Judge.from_config(config, cache=open_cache(cache), limits=Limits.from_config(config))
    try:
        await judge.ajudge("warm-up", [f"This passage only starts the judge ({time.time_ns()})."])
        start = time.perf_counter()
        results = await judge_queries(judge, as_queries(pairs), f"{lang}")
        seconds = time.perf_counter() - start
    finally:
        await judge.aclose()
    fresh = sum(not v.cached for jq in results for v in jq.verdicts)
    by_key = {f"{jq.query.query_id}/{v.passage_id}": v for jq in results for v in jq.verdicts}
    return by_key, (seconds / fresh if fresh else float("nan"))


def rows_of(variant: str, lang: str, pairs: list[Pair], verdicts: dict[str, Verdict]) -> list[dict]:
    rows = []
    for p in pairs:
        v = verdicts[p.key]
        raw = (v.raw or "").strip()
        rows.append(
            {
                "variant": variant,
                "lang": lang,
                "key": p.key,
                "split": split_of(p.query_id),
                "query": p.query,
                "text": p.text[:300],
                "gold": p.label,
                "status": v.status,
                "label": v.label,
                "p": v.probability,
                "reason": v.reason,
                "cut": bool(raw) and not raw.endswith("}"),
                "stance": stance(v.reason),
            }
        )
    return rows


# ---- figures --------------------------------------------------------------------------------


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "0/0"


def figures(rows: list[dict]) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == "ok"]
    yes = [r for r in ok if r["label"] == "yes"]
    no = [r for r in ok if r["label"] == "no"]
    scored = [(r["p"], r["gold"] >= 2) for r in ok if r["p"] is not None]
    auc = roc_auc([s for s, _ in scored], [g for _, g in scored]) if scored else None
    return {
        "n": len(rows),
        "ok": len(ok),
        "yes->neg": _share(sum(r["stance"] == "not_relevant" for r in yes), len(yes)),
        "no->pos": _share(sum(r["stance"] == "relevant" for r in no), len(no)),
        "instr": _share(sum(r["stance"] == "instructions" for r in ok), len(ok)),
        "unclear": _share(sum(r["stance"] == "unclear" for r in ok), len(ok)),
        "cut": _share(sum(r["cut"] for r in rows), len(rows)),
        "auc": None if auc is None or auc != auc else round(auc, 3),
    }


def agreement(rows: list[dict], labels_path: Path) -> None:
    """The reader's agreement with hand labels, overall and as a confusion table."""
    by = {(r["variant"], r["lang"], r["key"]): r for r in rows}
    pairs = []
    with labels_path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                lab = json.loads(line)
                row = by.get((lab["variant"], lab["lang"], lab["key"]))
                if row is not None:
                    pairs.append((lab["stance"], stance(row["reason"]), row["reason"]))
    if not pairs:
        print(f"{labels_path}: no hand label matches a judged pair")
        return
    same = sum(h == m for h, m, _ in pairs)
    print(f"\nstance reader vs hand labels: {_share(same, len(pairs))} agree")
    for h, m, reason in pairs:
        if h != m:
            print(f"  hand {h:<13} reader {m:<13} {reason!r}")


def judge_all(args: argparse.Namespace) -> tuple[list[dict], dict[tuple[str, str], float]]:
    """Every variant's rows, judged (or read from ``--cache``), and seconds per passage."""
    samples = {
        "en": stratified_sample(read_pairs(args.en), args.en_pairs, args.seed),
        "zh": stratified_sample(read_pairs(args.zh), args.zh_pairs, args.seed),
    }
    rows: list[dict] = []
    speed: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-reasons-") as tmp:
        cache = args.cache or Path(tmp) / "cache.sqlite"
        for name, *sets in args.variant:
            for lang, pairs in samples.items():
                if not pairs:
                    continue
                print(f"variant {name} ({lang}): {' '.join(sets)}", file=sys.stderr, flush=True)
                verdicts, s = asyncio.run(judge_variant(args.config, sets, cache, pairs, lang))
                rows += rows_of(name, lang, pairs, verdicts)
                speed[(name, lang)] = s
    return rows, speed


def print_table(rows: list[dict], speed: dict[tuple[str, str], float]) -> None:
    head = ("n", "ok", "yes->neg", "no->pos", "instr", "unclear", "cut", "auc")
    print(
        f"\n{'variant':<16}{'lang':<5}{'split':<9}"
        + "".join(f"{h:>13}" for h in head)
        + "  s/passage"
    )
    for name, lang in dict.fromkeys((r["variant"], r["lang"]) for r in rows):
        for split in ("tune", "held-out", "all"):
            part = [
                r
                for r in rows
                if r["variant"] == name and r["lang"] == lang and split in ("all", r["split"])
            ]
            f = figures(part)
            cells = "".join(f"{f[h]!s:>13}" for h in head)
            sec = speed.get((name, lang), float("nan")) if split == "all" else float("nan")
            tail = f"  {sec:.1f}" if sec == sec else ""
            print(f"{name:<16}{lang:<5}{split:<9}{cells}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("config", type=Path, nargs="?")
    ap.add_argument("--en", type=Path, default=EN_PAIRS, help="English labelled pairs")
    ap.add_argument("--zh", type=Path, default=ZH_PAIRS, help="Chinese labelled pairs")
    ap.add_argument("--en-pairs", type=int, default=30)
    ap.add_argument("--zh-pairs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--variant", nargs="+", action="append", metavar=("NAME", "KEY=VALUE"))
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--dump", type=Path, help="every pair's reason and stance, JSONL")
    ap.add_argument(
        "--from-dump",
        type=Path,
        action="append",
        help="judge nothing: the rows of earlier --dump files, stances read again",
    )
    ap.add_argument("--labels", type=Path, help="hand-labelled stances, JSONL")
    args = ap.parse_args()
    if args.from_dump:
        rows = [
            {**row, "stance": stance(row["reason"])}
            for path in args.from_dump
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
            for row in [json.loads(line)]
        ]
        speed: dict[tuple[str, str], float] = {}
    elif args.config is None or not args.variant:
        ap.error("give a config and at least one --variant (or --from-dump)")
    else:
        rows, speed = judge_all(args)
    if args.dump:
        with args.dump.open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    print_table(rows, speed)
    if args.labels:
        agreement(rows, args.labels)
    stances = {s: sum(r["stance"] == s for r in rows) for s in STANCES}
    print(
        f"\nstances over every variant: {stances}; mean P(yes) "
        f"{statistics.fmean(r['p'] for r in rows if r['p'] is not None):.3f}"
    )


if __name__ == "__main__":
    main()
