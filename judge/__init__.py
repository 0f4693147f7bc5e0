"""judge: an LLM-as-judge contextual-relevancy evaluator.

Public API only; everything else is private and may change.
"""

from judge.errors import JudgeError
from judge.schema import JudgedQuery, Passage, Query, Scale, ScaleLabel, Usage, Verdict

__all__ = [
    "JudgeError",
    "JudgedQuery",
    "Passage",
    "Query",
    "Scale",
    "ScaleLabel",
    "Usage",
    "Verdict",
]

__version__ = "0.1.0"
