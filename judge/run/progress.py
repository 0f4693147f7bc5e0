"""Progress of a run: one refreshed line on a TTY, periodic log lines elsewhere.

Passages count as each verdict is made, inside a unit too (judging/units.py hands them on):
a single query of 50,000 passages shows its progress while it lasts. A unit's count is
settled when its whole result is in: a verdict made again (a listwise round's fallback) or
one made outside the rounds (a cascade's reranker labels) is counted then."""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from judge.calling.caller import Caller
from judge.data.results import UnitKey
from judge.errors import NOT_SENT
from judge.schema import JudgedQuery, Verdict

log = logging.getLogger(__name__)


def _shown(verdict: Verdict) -> str:
    """How the line counts a verdict: its status, or "not sent" for a passage a stopping run
    never asked (counted apart from errors, as the summary counts it)."""
    if verdict.status == "error" and verdict.error and NOT_SENT in verdict.error:
        return "not sent"
    return verdict.status


@dataclass
class Progress:
    """Counters shown on a TTY as one refreshed line, elsewhere as periodic log lines."""

    total_units: int
    total_passages: int
    caller: Caller
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    interval_s: float = 10.0
    units: int = 0
    passages: int = 0
    status: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    _last: float = 0.0
    _logged: str = ""
    # Verdicts made so far in units not yet finished, and their statuses, by unit.
    _open: dict[UnitKey, Counter[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._tty = self.stream.isatty()  # asked once: show() runs for every verdict

    def told(self, key: UnitKey, verdict: Verdict) -> None:
        """A verdict of the unfinished unit ``key``, just made."""
        self._open.setdefault(key, Counter())[_shown(verdict)] += 1
        self.passages += 1
        self.status[_shown(verdict)] += 1
        self.show()

    def update(self, jq: JudgedQuery) -> None:
        """The unit ``jq`` finished: its verdicts replace what was counted of it so far."""
        counted = self._open.pop(jq.key, Counter())
        self.units += 1
        self.passages += len(jq.verdicts) - counted.total()
        self.status.subtract(counted)
        self.status.update(_shown(v) for v in jq.verdicts)
        self.show()

    def line(self) -> str:
        s, b, slot = self.caller.stats, self.caller.budget, self.caller.slots["chat"]
        elapsed = time.monotonic() - self.started
        rate = self.passages / elapsed if elapsed > 0 else 0.0
        unsent = f"  not sent {self.status['not sent']}" if self.status["not sent"] else ""
        return (
            f"queries {self.units}/{self.total_units}"
            f"  passages {self.passages}/{self.total_passages}"
            f"  ({rate:.1f}/s)  cached {s.cache_hits}  retries {s.retries}"
            f"  unparsed {self.status['unparsed']}  errors {self.status['error']}{unsent}"
            f"  tokens {b.usage.total}  ${b.cost:.4f}"
            f"  in flight {slot.in_flight}/{slot.current}"
        )

    def show(self, final: bool = False) -> None:
        now = time.monotonic()
        tty = self._tty
        if tty and (final or now - self._last >= 0.2):
            self.stream.write("\r" + self.line() + ("\n" if final else ""))
            self.stream.flush()
            self._last = now
        elif not tty and (final or now - self._last >= self.interval_s):
            line = self.line()
            if line != self._logged:  # the final line may just have been logged
                log.info("%s", line)
                self._logged = line
            self._last = now
