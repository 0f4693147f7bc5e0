"""``judge run --mlflow`` and ``judge.log_to_mlflow``: a finished run directory as an MLflow run.

What one MLflow run holds, read from the directory's summary.json and files:

- params: the judge's settings (``judge.*``: provider, model, scale, mode, template, ...), the
  provider's overrides (``provider.*``, never a key: only the name of its variable), the
  reranker's (``rerank.*``), ``repeats``, ``dataset``, ``metrics`` and the primary metric,
  ``engines``, ``queries``, ``judge_version``;
- metrics: per engine and metric its mean and 95% bootstrap CI, as ``ENGINE/METRIC``,
  ``ENGINE/METRIC.ci_low`` and ``ENGINE/METRIC.ci_high`` (MLflow keys cannot hold ``@``:
  ``ndcg@10`` is ``ndcg_at_10``; a file store cannot hold a key under another), and the
  run's ``judge/...`` figures: verdicts by status, unparsed and error rates, tokens, cost,
  calls, cache hits, seconds;
- tags: ``judge.outcome`` (PASSED / FAILED / INCOMPLETE / JUDGE UNRELIABLE), ``judge.exit_code``
  (what ``judge run`` exits with), ``judge.reasons``, ``judge.run_dir``, ``judge.version``, and
  the verdict lines as the run's description;
- artefacts: summary.json, report.html, report.md, verdicts.jsonl, qrels.txt (and nuggets.jsonl
  when the run wrote one).

Runs of one config in one experiment then compare in the MLflow UI metric by metric. MLflow is
imported only here and only when asked; its tracking URI and experiment come from MLflow's
own settings (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``) unless given.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from judge.data.nuggets import NUGGETS_FILE
from judge.data.results import RESULTS_FILE
from judge.errors import ConfigError, InputError
from judge.report.finish import QRELS_FILE
from judge.report.read import JudgedRun
from judge.report.status import config_name
from judge.report.summary import SUMMARY_FILE, Summary, load_summary

__all__ = ["check_mlflow", "log_to_mlflow", "metric_key"]

ARTEFACTS = (SUMMARY_FILE, "report.html", "report.md", RESULTS_FILE, QRELS_FILE, NUGGETS_FILE)
INSTALL = "MLflow is not installed: pip install 'judge[mlflow]'"
# MLflow's limits: characters a key may hold, a param value's length (500 before MLflow 2.x's
# 6000: the lower), a tag's, and entries per log_batch request.
log = logging.getLogger(__name__)
_NOT_IN_KEY = re.compile(r"[^\w.\- /:]")
_PARAM_CHARS, _TAG_CHARS = 500, 5000
_BATCH = {"metrics": 1000, "params": 100, "tags": 100}


def metric_key(*parts: str) -> str:
    """An MLflow metric key from ``parts`` joined by "/": ``@`` spelled ``_at_``, any other
    character MLflow refuses replaced by ``_``."""
    return "/".join(_NOT_IN_KEY.sub("_", p.replace("@", "_at_")) for p in parts)


def _mlflow() -> Any:
    """The mlflow module, or ConfigError saying how to install it."""
    try:
        import mlflow
    except ImportError:
        raise ConfigError(f"mlflow: {INSTALL}") from None
    return mlflow


def _cause(exc: BaseException) -> str:
    """An exception in one line of at most ~300 characters: its start and its end, where
    urllib3's long retry messages put the cause ("Connection refused")."""
    said = " ".join((str(exc).strip() or type(exc).__name__).split())
    return said if len(said) <= 300 else f"{said[:120]} ... {said[-170:]}"


@contextlib.contextmanager
def _quick_http() -> Iterator[None]:
    """MLflow's HTTP retries kept short while judge checks the store before paying (its
    defaults, 7 retries with backoff and a 120 s timeout, made a server that is down take
    four minutes to say so); the user's own settings are kept."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    added = {k: v for k, v in quick.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def check_mlflow() -> None:
    """Before anything is paid: ConfigError when MLflow is not installed or its tracking store
    (``MLFLOW_TRACKING_URI``) cannot be read."""
    mlflow = _mlflow()
    uri = mlflow.get_tracking_uri()
    try:
        with _quick_http():
            mlflow.MlflowClient(uri).search_experiments(max_results=1)
    except Exception as exc:
        # With MLFLOW_TRACKING_URI unset, MLflow's own default store is used, which some
        # installs (mlflow-skinny: a SQLite file needs SQLAlchemy) cannot open.
        unset = (
            ""
            if os.environ.get("MLFLOW_TRACKING_URI")
            else (
                " (MLFLOW_TRACKING_URI is not set, so this is MLflow's default store: set it, e.g. "
                "to file:./mlruns or your tracking server's http:// address)"
            )
        )
        raise ConfigError(f"mlflow: the tracking store {uri} fails: {_cause(exc)}{unset}") from None


def _run_dir(run: str | Path | JudgedRun) -> Path:
    if not isinstance(run, str | Path | JudgedRun):  # judge_many's results, a summary, ...
        raise TypeError(
            f"log_to_mlflow logs a run directory (or read_run's result), not a "
            f"{type(run).__name__}: write judged results to one first with "
            "judge.finish_run(config, run_dir, results=...), then log that directory"
        )
    path = run.path if isinstance(run, JudgedRun) else Path(run)
    return path.parent if path.is_file() else path


def _flat(prefix: str, values: dict[str, Any] | None) -> Iterator[tuple[str, Any]]:
    """``prefix.key`` for every set value, nested tables as dotted keys."""
    for key, value in (values or {}).items():
        if isinstance(value, dict):
            yield from _flat(f"{prefix}.{key}", value)
        elif value is not None and value != [] and value != {}:
            yield f"{prefix}.{key}", value


def _params(summary: Summary) -> dict[str, str]:
    c = summary.config
    params: dict[str, Any] = dict(_flat("judge", c.judge))
    params.update(_flat("provider", c.provider))
    params.update(_flat("rerank", c.rerank))
    params.update(_flat("aspects", c.aspects))
    params.update(
        {
            "scale": c.scale.name,
            "repeats": c.repeats,
            "dataset": summary.dataset,
            "metrics": ",".join(summary.metric_names),
            "primary_metric": summary.policy.primary,
            "engines": ",".join(summary.counts.engines),
            "queries": summary.counts.queries,
            "judge_version": summary.judge_version,
        }
    )
    # summary.json holds no secret (an API key's variable name at most): params may show all.
    return {metric_key(k): str(v)[:_PARAM_CHARS] for k, v in params.items() if v is not None}


def engine_keys(engines: Iterable[str]) -> dict[str, str]:
    """Each engine's key segment: :func:`metric_key`'s spelling, with "/" and a segment of dots
    (``../up`` would name another key: MLflow refuses it) spelled ``_``; engines whose keys
    would be one (``bm25+rm3``, ``bm25_rm3``: one's metrics overwrote the other's) each get a
    short digest of their name after it, said in a warning."""
    plain = {e: metric_key(e).replace("/", "_") for e in engines}
    plain = {e: k if k.strip(".") else "_" for e, k in plain.items()}
    shared = Counter(plain.values())
    keys = {
        e: f"{k}_{hashlib.blake2b(e.encode(), digest_size=3).hexdigest()}" if shared[k] > 1 else k
        for e, k in plain.items()
    }
    if renamed := sorted(e for e, k in plain.items() if shared[k] > 1):
        log.warning(
            "MLflow: engines %s would share metric keys; logged as %s",
            ", ".join(renamed),
            ", ".join(keys[e] for e in renamed),
        )
    return keys


def _metrics(summary: Summary) -> dict[str, float]:
    out: dict[str, float] = {}
    keys = engine_keys(summary.engines)
    for engine, data in summary.engines.items():
        for name, m in data.metrics.items():
            for suffix, value in (("", m.mean), (".ci_low", m.ci_low), (".ci_high", m.ci_high)):
                if value is not None:
                    out[metric_key(keys[engine], name + suffix)] = value
    c, u = summary.counts, summary.usage
    figures: dict[str, float | None] = {
        "verdicts": c.verdicts,
        "ok": c.ok,
        "unparsed": c.unparsed,
        "error": c.error,
        "unparsed_rate": c.unparsed_rate,
        "error_rate": c.error_rate,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        # The results' tokens at list price, cached answers included: what judging them
        # costs, not what this run paid (spent_usd).
        "list_cost_usd": u.cost_usd,
    }
    if summary.run is not None:
        figures |= {
            "requests": summary.run.requests,
            "cache_hits": summary.run.cache_hits,
            "elapsed_s": summary.run.elapsed_s,
            "spent_usd": summary.run.cost_usd,  # paid by this run: 0 for a cached re-run
        }
    out |= {metric_key("judge", k): float(v) for k, v in figures.items() if v is not None}
    return out


def _tags(summary: Summary, run_dir: Path) -> dict[str, str]:
    tags = {
        "judge.run_dir": str(run_dir.resolve()),
        "judge.version": summary.judge_version,
        "mlflow.note.content": "\n".join(summary.verdict),
    }
    if summary.outcome is not None:
        tags |= {
            "judge.outcome": summary.outcome.status,
            "judge.exit_code": str(summary.outcome.exit_code),
            "judge.reasons": "\n".join(summary.outcome.reasons),
        }
    return {k: v[:_TAG_CHARS] for k, v in tags.items()}


def log_to_mlflow(
    run: str | Path | JudgedRun,
    *,
    experiment: str | None = None,
    run_name: str | None = None,
) -> str:
    """Log a finished run directory (or ``read_run``'s result) to MLflow; the MLflow run's id.

    Into the active MLflow run when there is one and no ``experiment`` is named (a run
    nested in it when it holds another judge run's params already); else a new
    run (named ``run_name``, default: the config's name and the directory's) in
    ``experiment`` (created if missing; default: MLflow's own choice). Raises InputError when
    the directory has no summary.json, ConfigError when MLflow is missing or fails.
    """
    mlflow = _mlflow()
    run_dir = _run_dir(run)
    if not (run_dir / SUMMARY_FILE).is_file():
        raise InputError(
            f"no {SUMMARY_FILE}: summarise the run first (judge run, or finish_run)",
            file=str(run_dir),
        )
    summary = load_summary(run_dir / SUMMARY_FILE)
    try:
        return _log(mlflow, summary, run_dir, experiment, run_name)
    except Exception as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"mlflow: logging {run_dir} to {mlflow.get_tracking_uri()} failed: {_cause(exc)} "
            f"(the run is complete on disk; judge.log_to_mlflow({str(run_dir)!r}) logs it later)"
        ) from None


def _log(
    mlflow: Any, summary: Summary, run_dir: Path, experiment: str | None, run_name: str | None
) -> str:
    """A new MLflow run for ``summary`` (or the active one), logged by :func:`_log_into`."""
    client = mlflow.MlflowClient()
    active = mlflow.active_run()
    if active is not None and experiment is None and not _holds_another(client, active, summary):
        _log_into(client, active.info.run_id, summary, run_dir)
        return str(active.info.run_id)
    experiment_id = None
    if experiment:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    name = run_name or f"{config_name(summary.config.source)} {run_dir.name}".strip()
    nested = active is not None
    with mlflow.start_run(experiment_id=experiment_id, run_name=name, nested=nested) as started:
        _log_into(client, started.info.run_id, summary, run_dir)
        return str(started.info.run_id)


def _holds_another(client: Any, active: Any, summary: Summary) -> bool:
    """Whether the active MLflow run already holds params of another judge run (MLflow
    refuses to change a param): this one then goes into a run nested in it, not half into
    it (its metrics were written before the params failed, beside the other run's)."""
    held = client.get_run(active.info.run_id).data.params
    return any(k in held and held[k] != v for k, v in _params(summary).items())


def _log_into(client: Any, run_id: str, summary: Summary, run_dir: Path) -> None:
    from mlflow.entities import Metric, Param, RunTag

    stamp = int(time.time() * 1000)
    entries: dict[str, list[Any]] = {  # params first: what MLflow may refuse, before the rest
        "params": [Param(k, v) for k, v in _params(summary).items()],
        "metrics": [Metric(k, v, stamp, 0) for k, v in _metrics(summary).items()],
        "tags": [RunTag(k, v) for k, v in _tags(summary, run_dir).items()],
    }
    for kind, items in entries.items():
        step = _BATCH[kind]
        for start in range(0, len(items), step):
            client.log_batch(run_id, **{kind: items[start : start + step]})
    for artefact in ARTEFACTS:
        if (run_dir / artefact).is_file():
            client.log_artifact(run_id, str(run_dir / artefact))
