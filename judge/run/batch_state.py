"""A run directory's record of its provider batches (``batch.json``), written atomically.

Each step that could leave a batch paid for but forgotten is recorded before the next one
starts: the requests and their reservation before the upload, the input file's id before the
batch is created, the batch's id as soon as it is known, and its outcome once its output is
stored. A rerun (after a kill, a crash or Ctrl-C) reads this file and polls a recorded batch
instead of submitting it again. The file is replaced whole (write, fsync, rename), so a kill
leaves the old record or the new one, never half of one.

It holds no secret: the provider is recorded as its spec (base URL, the *name* of the API key's
environment variable), so ``judge batch status|cancel RUN_DIR`` need no config.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from judge.errors import ConfigError
from judge.providers.base import ProviderSpec
from judge.schema import Record, Usage

__all__ = ["STATE_FILE", "BatchRecord", "BatchState", "Leftover", "load_state", "save_state"]

STATE_FILE = "batch.json"

LeftReason = Literal["unparsed", "failed", "expired", "cancelled", "given up"]


class Leftover(Record):
    """A request a batch gave no usable answer: why, and an unparsed answer's text (its re-ask
    carries it, as a live re-ask would)."""

    reason: LeftReason
    detail: str = ""
    answer: str | None = None


# A batch record's status from the moment its create is sent until the answer names the
# batch: a create whose answer never came may have made it, so it is looked for before
# anything is created again, for LIST_LAG_S seconds (a provider's list may lag its creates).
MAYBE_MADE = "maybe made"
LIST_LAG_S = 600.0


class BatchRecord(Record):
    """One provider batch, from its requests to its outcome."""

    round: int = 0  # 0: first-round requests; 1: the follow-up of what round 0 left
    custom_ids: tuple[str, ...]
    # Follow-up re-asks: a re-ask's custom id -> the first-round custom id it answers.
    answers: dict[str, str] = Field(default_factory=dict)
    reserved: Usage = Usage()  # the worst case held against the budget (batch prices)
    reserved_cost: float = 0.0
    input_file_id: str | None = None
    batch_id: str | None = None
    # "prepared" (recorded, not uploaded), "uploaded", "maybe made" (its create was sent at
    # ``create_sent`` and no answer named the batch yet: looked for before anything is
    # created again), then the provider's statuses.
    status: str = "prepared"
    create_sent: float | None = None
    collected: bool = False  # output read and stored; nothing more to do with this batch
    answered: int = 0  # answers that parsed and are in the cache
    usage: Usage = Usage()  # what its answers used (billed), at batch prices below
    cost: float = 0.0
    leftovers: dict[str, Leftover] = Field(default_factory=dict)  # by first-round custom id
    created: float = Field(default_factory=time.time)

    def first_id(self, custom_id: str) -> str:
        """The first-round custom id a line of this batch answers."""
        return self.answers.get(custom_id, custom_id)


class BatchState(Record):
    provider: ProviderSpec
    model: str
    batches: tuple[BatchRecord, ...] = ()

    def with_batch(self, index: int, record: BatchRecord) -> BatchState:
        """This state with batch ``index`` replaced (``len(batches)``: appended)."""
        batches = list(self.batches)
        if index == len(batches):
            batches.append(record)
        else:
            batches[index] = record
        return self.model_copy(update={"batches": tuple(batches)})

    def in_round(self, round_: int) -> set[str]:
        """The first-round custom ids some batch of ``round_`` was asked about."""
        return {b.first_id(c) for b in self.batches if b.round == round_ for c in b.custom_ids}

    def left_in_round(self, round_: int) -> set[str]:
        """The first-round custom ids a batch of ``round_`` was asked about and did not answer
        (or has not yet: not collected)."""
        return {
            first
            for b in self.batches
            if b.round == round_
            for first in (b.leftovers if b.collected else map(b.first_id, b.custom_ids))
        }


def load_state(out_dir: Path) -> BatchState | None:
    """The run directory's batch record (None: no batch was ever prepared there)."""
    path = out_dir / STATE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: byte {exc.start}: not UTF-8 text; this file records batches that may be "
            "paid for: restore it, or check them with the provider before removing it"
        ) from None
    try:
        return BatchState.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the file)"
        raise ConfigError(
            f"{path}: field '{where}': {first['msg']}; this file records batches that may be "
            "paid for: restore it, or check them with the provider before removing it"
        ) from None


def save_state(out_dir: Path, state: BatchState) -> None:
    """Replace the record whole: written beside it, flushed to disk, renamed over it."""
    path = out_dir / STATE_FILE
    temporary = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    data = json.dumps(state.model_dump(mode="json"), indent=1, ensure_ascii=False)
    with open(temporary, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, path)
    directory = os.open(out_dir, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)
