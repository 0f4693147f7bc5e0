"""Every error judge raises on purpose.

The CLI prints a :class:`JudgeError` as one line (``judge: <message>``) and exits
with the error's ``exit_code``; anything else is a bug and keeps its traceback.

::

    JudgeError                      exit 2 unless noted
    ├── InputError                  a dataset, results or qrels file is malformed
    │                               (message names file:line and field)
    ├── ConfigError                 a TOML config or a CLI override is invalid
    ├── TemplateError               a prompt template is missing, fails to load or render
    ├── ProviderError               a provider call failed after the runner's retries
    │                               (exit 3: requests may have been sent and paid)
    │   ├── ProviderConfigError     unknown provider kind, missing API key variable, bad URL
    │   │                           (exit 2: found before anything is sent)
    │   ├── ResponseError           the provider answered, but not in its own protocol
    │   │   └── NotTheApiError      a page or text where the API should be (not retried)
    │   └── BatchGone               the provider does not know a recorded batch (404)
    ├── ParseError                  a judge completion is not a valid verdict (before reask)
    ├── CacheError                  the completion cache cannot be opened or written
    ├── ModelError                  the embedded model cannot be fetched, verified or started
    ├── BudgetExceeded              --max-cost / --max-tokens reached (exit 4, resumable)
    ├── BatchPending                a submitted batch could not be followed to its end
    │                               (exit 3, incomplete: a rerun polls it, never resubmits)
    ├── WriteError                  a run's file could not be written once judging began
    │                               (exit 3, incomplete: a full disk, say; a rerun resumes)
    └── RunUnfinished               a run directory's run stopped before its summary
                                    (exit 3, incomplete: killed, say; a rerun finishes it)
"""

from __future__ import annotations


class JudgeError(Exception):
    """Base of every deliberate judge error; ``str(err)`` is the one line users see."""

    exit_code: int = 2


class InputError(JudgeError):
    """A dataset or results file is malformed.

    ``file``, ``line`` and ``field`` are kept as attributes so callers can
    collect many problems before failing.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.detail = message
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}{what}{message}")


class ConfigError(JudgeError):
    """A run config (TOML) or a command-line override is invalid."""


class TemplateError(JudgeError):
    """A prompt template is missing, invalid, or lacks a required variable."""


# Begins the error of a request a stopping run never sent (calling/caller.py): its verdict is
# an error to ask again, not a provider's failure, and is counted apart (report/summary.py).
NOT_SENT = "not sent: "


class ProviderError(JudgeError):
    """A provider call failed (after the runner's retries, where retrying applied). Raised
    out of a command, it ends it incomplete (exit 3): requests may have been sent and paid,
    so it is not "bad input, nothing was sent" (exit 2)."""

    exit_code = 3

    def __init__(self, message: str, *, kind: str = "provider", attempts: int = 0) -> None:
        self.kind = kind
        self.attempts = attempts
        super().__init__(message)


class ProviderConfigError(ProviderError):
    """A provider is misconfigured: unknown kind, missing key variable, bad base URL (found
    before anything is sent: exit 2)."""

    exit_code = 2


class ResponseError(ProviderError):
    """The provider answered, but the answer does not follow its wire protocol."""


class NotTheApiError(ResponseError):
    """A success status with no JSON at all (an HTML page, plain text): the URL reaches
    something other than the API, such as a web UI. Every request would get the same, so it
    is not retried."""


class BatchGone(ProviderError):
    """The provider does not know a recorded batch (HTTP 404): deleted, or asked with another
    key, organisation or base URL than the one that submitted it. Waiting cannot cure it."""


class ParseError(JudgeError):
    """A completion could not be read as a verdict on the scale."""


class CacheError(JudgeError):
    """The completion cache could not be opened or written."""


class ModelError(JudgeError):
    """The embedded judge's model could not be fetched, verified or served."""


class BudgetExceeded(JudgeError):
    """A cost or token budget was reached; the run stopped cleanly and can resume."""

    exit_code = 4


class BatchPending(JudgeError):
    """A recorded batch could not be followed to its end (the provider unreachable while
    polling or downloading): the run is incomplete (exit 3); a rerun polls it again."""

    exit_code = 3


class WriteError(JudgeError):
    """A file of a run (results, summary, reports) could not be written once judging began:
    what was judged is in the results and the cache, so the run is incomplete (exit 3) and
    the same command resumes it once the cause (a full disk, say) is gone."""

    exit_code = 3


class RunUnfinished(JudgeError):
    """A run directory whose run stopped before it wrote its summary (killed outright, say):
    nothing can say it passed, so it is incomplete (exit 3); the same ``judge run`` resumes
    and finishes it."""

    exit_code = 3
