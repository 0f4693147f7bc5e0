"""judge: an LLM-as-judge contextual-relevancy evaluator.

Public API only; everything else is private and may change::

    from judge import Judge, compare_engines, load_config
    with Judge(provider="local", model="qwen2.5") as j:
        jq = j.judge("what is rust?", ["Rust is a systems language.", "Bananas are yellow."])
        judged = j.judge_many(df, columns={"question": "query", "contexts": "retrieved_texts"})
    compare_engines(judged)  # judge compare's paired table, as a DataFrame

Names are imported on first use, so ``import judge.errors`` (what every module does) stays
cheap and ``import judge`` does not pull in the providers' SDKs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from judge.version import __version__

# Public name -> the module that defines it.
_EXPORTS = {
    "Judge": "judge.judging.judge",
    "Judgements": "judge.judging.tables",
    "JudgedRun": "judge.report.read",
    "read_run": "judge.report.read",
    "compare_engines": "judge.report.read",
    "load_config": "judge.config",
    "RunConfig": "judge.config",
    "Price": "judge.config",
    "Limits": "judge.calling.limits",
    "finish_run": "judge.report.finish",
    "log_to_mlflow": "judge.report.mlflow_run",
    "JudgeHealth": "judge.analysis.health",
    "calibrate": "judge.analysis.calibration",
    "relevance_pairs": "judge.analysis.calibration",
    "run_async": "judge.run.runner",
    "RunOutcome": "judge.run.runner",
    "Summary": "judge.report.summary",
    "JudgedQuery": "judge.schema",
    "MetricPolicy": "judge.schema",
    "Passage": "judge.schema",
    "Query": "judge.schema",
    "SamplingParams": "judge.schema",
    "Scale": "judge.schema",
    "ScaleLabel": "judge.schema",
    "Usage": "judge.schema",
    "Verdict": "judge.schema",
    "JudgeError": "judge.errors",
    "InputError": "judge.errors",
    "ConfigError": "judge.errors",
    "TemplateError": "judge.errors",
    "ProviderError": "judge.errors",
    "ProviderConfigError": "judge.errors",
    "ResponseError": "judge.errors",
    "ParseError": "judge.errors",
    "CacheError": "judge.errors",
    "ModelError": "judge.errors",
    "BudgetExceeded": "judge.errors",
    "BatchPending": "judge.errors",
}

__all__ = [
    "BatchPending",
    "BudgetExceeded",
    "CacheError",
    "ConfigError",
    "InputError",
    "Judge",
    "JudgeError",
    "JudgeHealth",
    "JudgedQuery",
    "JudgedRun",
    "Judgements",
    "Limits",
    "MetricPolicy",
    "ModelError",
    "ParseError",
    "Passage",
    "Price",
    "ProviderConfigError",
    "ProviderError",
    "Query",
    "ResponseError",
    "RunConfig",
    "RunOutcome",
    "SamplingParams",
    "Scale",
    "ScaleLabel",
    "Summary",
    "TemplateError",
    "Usage",
    "Verdict",
    "__version__",
    "calibrate",
    "compare_engines",
    "finish_run",
    "load_config",
    "log_to_mlflow",
    "read_run",
    "relevance_pairs",
    "run_async",
]

if TYPE_CHECKING:
    from judge.analysis.calibration import calibrate, relevance_pairs
    from judge.analysis.health import JudgeHealth
    from judge.calling.limits import Limits
    from judge.config import Price, RunConfig, load_config
    from judge.errors import (
        BatchPending,
        BudgetExceeded,
        CacheError,
        ConfigError,
        InputError,
        JudgeError,
        ModelError,
        ParseError,
        ProviderConfigError,
        ProviderError,
        ResponseError,
        TemplateError,
    )
    from judge.judging.judge import Judge
    from judge.judging.tables import Judgements
    from judge.report.finish import finish_run
    from judge.report.mlflow_run import log_to_mlflow
    from judge.report.read import JudgedRun, compare_engines, read_run
    from judge.report.summary import Summary
    from judge.run.runner import RunOutcome, run_async
    from judge.schema import (
        JudgedQuery,
        MetricPolicy,
        Passage,
        Query,
        SamplingParams,
        Scale,
        ScaleLabel,
        Usage,
        Verdict,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'judge' has no attribute '{name}'")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
