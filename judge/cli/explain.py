"""``judge explain RUN_DIR --query QID``: an LLM's reason for the passages a user opens.

A judge by score gives no reasons, and a small local LLM's short reasons after its verdict
often contradict it; so reasons are asked for afterwards, only for the passages a user opens.
The run's verdicts are read from its directory; each chosen passage is asked once more, with
the reason before the verdict (the verdict then follows from the reason), by the run's
``[judge]`` LLM when it has one, else by the embedded LLM (``--provider`` / ``--model`` choose
another). The answer goes through the Caller like any call: the run's cache (a second explain
of a passage pays nothing), its budget and its retries. The explainer's verdict is printed
beside the run's; when they differ, that is said plainly: the reason then argues for the
explainer's verdict, not the run's.

Every input (run directory, query, engine, passages, config, provider) is checked before
anything is sent; a bad one is one line and exit 2.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from judge.calling.cache import open_cache
from judge.calling.limits import Limits
from judge.cli.common import EXIT_INCOMPLETE, EXIT_OK, overrides
from judge.config import ProviderSection, RunConfig, load_config
from judge.data.results import load_results
from judge.errors import ConfigError, InputError
from judge.judging.context import preset_context
from judge.judging.judge import Judge
from judge.providers import judges_by_score, resolve_spec
from judge.run.resume import RUN_FILE, config_source
from judge.schema import JudgedQuery, Passage, SamplingParams, Verdict

# The LLM a judge by score is explained by: the embedded one, with the sampling the cascade
# config gives it (a JSON grammar keeps the 0.5B model's answer readable).
EMBEDDED = "embedded"
EMBEDDED_MODEL = "qwen2.5-coder-0.5b-instruct-q4"
EMBEDDED_PARAMS = SamplingParams(
    temperature=0.0, max_tokens=96, logprobs=True, top_logprobs=5, response_format="json_object"
)
# Room for a reason written before its verdict; a config's larger max_tokens is kept.
REASON_TOKENS = 96
REASON_WORDS = 30
# The embedded server answers one request at a time, slowly on a busy CPU.
EMBEDDED_TIMEOUT_S = 180.0


def add_commands(sub: Any) -> None:
    """Register ``judge explain`` on the top-level subparsers."""
    e = sub.add_parser(
        "explain",
        help="ask an LLM why, for the passages of one query of a finished run",
        description="Print the run's verdict and score of each chosen passage beside an LLM's "
        "reason and its own verdict (the run's [judge] LLM, else the embedded one). Answers "
        "are cached: explaining a passage again pays nothing.",
    )
    e.add_argument("run_dir", help="a run directory (judge run --out)")
    e.add_argument("--query", required=True, help="the query id")
    e.add_argument("--engine", help="the engine (needed when the run judged several)")
    e.add_argument(
        "--passage",
        action="append",
        metavar="PID",
        help="a passage id (repeatable; default: every passage of the query)",
    )
    e.add_argument("--config", help="the run's config (default: the one run.json names)")
    e.add_argument("--provider", help="ask this provider instead (a preset or kind)")
    e.add_argument("--model", help="ask this model instead")
    e.add_argument("--cache", help="cache file (default: the config's)")
    e.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
    e.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError("no such run directory", file=str(run_dir))
    repeats = _query_rows(load_results(run_dir), args.query, args.engine, run_dir)
    row = repeats[0]
    chosen = _passages(row, args.passage)
    sets = overrides(args)
    config = _config(args.config, sets, run_dir)
    # A provider other than the run's gets only the [provider] keys given here with --set.
    own = {k.removeprefix("provider."): v for k, v in sets.items() if k.startswith("provider.")}
    config = _explainer_config(config, args.provider, args.model, own)
    judge_, explained = _judge(config), row.query.model_copy(update={"passages": chosen})
    with judge_:
        answers = judge_.judge(explained).verdicts
    return _print(repeats, chosen, answers, config)


def _query_rows(
    rows: Sequence[JudgedQuery], qid: str, engine: str | None, where: Path
) -> list[JudgedQuery]:
    """The rows of query ``qid`` (and ``engine``), repeat by repeat; one line when missing."""
    mine = [jq for jq in rows if jq.query.query_id == qid]
    if not mine:
        known = sorted({jq.query.query_id for jq in rows})
        shown = ", ".join(known[:8]) + (f" (+{len(known) - 8} more)" if len(known) > 8 else "")
        raise InputError(f"no query '{qid}' in this run; its queries: {shown}", file=str(where))
    engines = sorted({jq.query.engine for jq in mine})
    if engine is None and len(engines) > 1:
        raise InputError(
            f"query '{qid}' was judged for engines {', '.join(engines)}: choose one with --engine",
            file=str(where),
        )
    if engine is not None and engine not in engines:
        raise InputError(
            f"query '{qid}' has no engine '{engine}'; its engines: {', '.join(engines)}",
            file=str(where),
        )
    picked = [jq for jq in mine if jq.query.engine == (engine or engines[0])]
    return sorted(picked, key=lambda jq: jq.repeat)


def _passages(row: JudgedQuery, ids: Sequence[str] | None) -> tuple[Passage, ...]:
    """The row's passages named by ``ids`` (in the order given), or all of them."""
    by_id = {p.id: p for p in row.query.passages}
    if not ids:
        return row.query.passages
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise InputError(
            f"query '{row.query.query_id}' ({row.query.engine}) has no passage "
            f"{', '.join(repr(m) for m in missing)}; it has {len(by_id)}: "
            + ", ".join(list(by_id)[:8])
            + (" ..." if len(by_id) > 8 else "")
        )
    return tuple(by_id[i] for i in dict.fromkeys(ids))


def _config(path: str | None, sets: dict[str, Any], run_dir: Path) -> RunConfig:
    """``--config``, else the config the run directory's run.json names with the settings the
    run was started with (``--set``: its cache, provider, model); ``--set`` applied over
    either."""
    if path is not None:
        return load_config(path, sets)
    source, given = config_source(run_dir)
    if source is None or not Path(source).is_file():
        raise ConfigError(
            f"{run_dir}: cannot tell which config made this run ({RUN_FILE} names none "
            "that exists); pass --config"
        )
    return load_config(source, {**given, **sets})


def _explainer_config(
    config: RunConfig, provider: str | None, model: str | None, own: dict[str, Any]
) -> RunConfig:
    """``config`` with ``[judge]`` made the explainer: pointwise, no cascade, the reason before
    the verdict with room for it; the run's LLM, else the embedded one, unless named (with
    ``own`` as its ``[provider]`` table when it is not the run's)."""
    j = config.judge
    run_spec = resolve_spec(j.provider, config.provider.overrides())
    params, run = j.params, config.run
    if provider is None and judges_by_score(run_spec):
        provider, model = EMBEDDED, model or EMBEDDED_MODEL
        params = EMBEDDED_PARAMS
        timeout = max(run.timeout_s, EMBEDDED_TIMEOUT_S)
        run = run.model_copy(update={"concurrency": 1, "timeout_s": timeout})
        config = config.model_copy(update={"provider": ProviderSection.model_validate(own)})
    elif provider is not None and provider != j.provider:
        if model is None:
            raise ConfigError(f"--provider {provider}: name its model with --model")
        config = config.model_copy(update={"provider": ProviderSection.model_validate(own)})
    provider, model = provider or j.provider, model or j.model
    if params.max_tokens is not None and params.max_tokens < REASON_TOKENS:
        params = params.model_copy(update={"max_tokens": REASON_TOKENS})
    settings = j.model_copy(
        update={
            "provider": provider,
            "model": model,
            "mode": "pointwise",
            "template": None,
            "cascade": None,
            "reasons": True,
            "verdict_first": False,
            "max_reason_words": max(j.max_reason_words, REASON_WORDS),
            "params": params,
        }
    )
    spec = resolve_spec(provider, config.provider.overrides())
    if judges_by_score(spec):
        raise ConfigError(f"--provider {provider} is a reranker: it gives no reasons")
    settings = settings.model_copy(
        update={"context_tokens": j.context_tokens or preset_context(spec)}
    )
    return config.model_copy(update={"judge": settings, "run": run, "rerank": None})


def _judge(config: RunConfig) -> Judge:
    """The explainer, over the run's cache and limits (budget, retries, concurrency)."""
    limits = Limits.from_config(config)
    return Judge(
        config.judge,
        scale=config.scale(),
        cache=open_cache(config),
        limits=limits,
        **config.provider.overrides(),
    )


def _print(
    repeats: Sequence[JudgedQuery],
    chosen: Sequence[Passage],
    answers: Sequence[Verdict],
    config: RunConfig,
) -> int:
    """Each passage's run verdict beside the explainer's answer; exit 3 if one is missing by a
    provider error (a rerun may get it), not when an answer came that does not read."""
    row = repeats[0]
    run_verdicts = {v.passage_id: v for v in row.verdicts}
    said = {v.passage_id: v for v in answers}
    who = f"{config.judge.provider}/{config.judge.model}"
    q = row.query
    print(f"query {q.query_id} ({q.engine}): {q.query}")
    missing = 0
    for passage in chosen:
        mine = run_verdicts.get(passage.id)
        score = (row.rerank_scores or {}).get(passage.id)
        print(f"\npassage {passage.id}: {_snippet(passage.text)}")
        run_label, of_repeats = _run_label(repeats, passage.id)
        print(f"  run:       {_run_line(mine, score)}{of_repeats}")
        answer = said.get(passage.id)
        if answer is None or answer.status != "ok":
            # Exit 3 says a rerun may finish it: true of a provider error, not of an answer
            # that came and does not read (paid and kept: a rerun reads the same one).
            missing += answer is None or answer.status == "error"
            why = "no answer" if answer is None else answer.status
            detail = (answer.error or answer.raw or "") if answer is not None else ""
            print(f"  {who}: {why}{': ' + _snippet(detail) if detail else ''}")
            if answer is not None and answer.status == "unparsed":
                print(
                    "  (its answer is kept, and a rerun reads the same one: another --model, "
                    "or a template that asks for the format, may answer in it)"
                )
            continue
        if answer.source == "empty":  # judged without asking: no LLM said anything of it
            print(f"  {who}: not asked: the passage is empty, nothing to explain")
            continue
        p = f", P(relevant) {answer.probability:.2f}" if answer.probability is not None else ""
        cached = ", cached" if answer.cached else ""
        print(f"  {who}: {answer.label}{p}{cached}")
        print(f"  reason:    {answer.reason or '(none given)'}")
        if run_label is not None and run_label != answer.label:
            print(
                f"  DISAGREES: the run said {run_label!r}, {who} says {answer.label!r}; this "
                f"reason argues for {answer.label!r} and does not explain the run's verdict"
            )
    return EXIT_INCOMPLETE if missing else EXIT_OK


def _run_label(repeats: Sequence[JudgedQuery], pid: str) -> tuple[str | None, str]:
    """The label the run gave ``pid`` most often over its repeats (None: none, or a tie), and
    how its repeats split, to print beside repeat 0's verdict ("" with one repeat)."""
    labels = [v.label for jq in repeats for v in jq.verdicts if v.passage_id == pid and v.label]
    counts = Counter(labels).most_common()
    if not counts:
        return None, ""
    tie = len(counts) > 1 and counts[0][1] == counts[1][1]
    if len(repeats) == 1:
        return counts[0][0], ""
    split = ", ".join(f"{label} {n}" for label, n in counts)
    said = "no label most often" if tie else f"{counts[0][0]} most often"
    return (None if tie else counts[0][0]), (
        f" (repeat 0 of {len(repeats)}; over the repeats: {split}: {said})"
    )


def _run_line(verdict: Verdict | None, score: float | None) -> str:
    if verdict is None:
        return "no verdict in the run"
    if verdict.status != "ok":
        return verdict.status
    parts = [str(verdict.label)]
    if verdict.probability is not None:
        parts.append(f"score {verdict.probability:.2f}")
    if score is not None and score != verdict.probability:
        parts.append(f"reranker {score:.2f}")
    parts.append(f"by {verdict.source}")
    if verdict.signals:
        parts.append("flagged " + ", ".join(verdict.signals))
    line = ", ".join(parts)
    return line + (f"; its reason: {verdict.reason}" if verdict.reason else "")


def _snippet(text: str, width: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
