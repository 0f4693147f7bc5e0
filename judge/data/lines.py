"""Line-by-line reading of user files, collecting every error so one run shows them all.

:class:`Sink` gathers errors (each an InputError naming ``file:line`` and field) and non-fatal
notes; :class:`Row` checks the fields of one line into a sink; :func:`text_lines` and
:func:`json_lines` read a file's non-blank lines (UTF-8, a BOM skipped), and :func:`objects`
the JSON objects among them. Shared by the dataset, TREC run, results and qrels readers.
:func:`write_atomic` is the one way a run's files are written whole (summary, reports, qrels):
a reader, or a run stopped by a full disk, sees the old file or the new one, never half.
"""

from __future__ import annotations

import codecs
import json
import math
import numbers
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from judge.errors import InputError

__all__ = [
    "MAX_ERRORS_SHOWN",
    "MISSING",
    "Row",
    "Sink",
    "id_text",
    "is_integer",
    "json_lines",
    "kind",
    "objects",
    "read_bytes",
    "text_lines",
    "write_atomic",
]

MAX_ERRORS_SHOWN = 20


def capped(lines: Sequence[str], limit: int = MAX_ERRORS_SHOWN) -> list[str]:
    """The first ``limit`` of ``lines``, and how many more there are (one note per empty
    passage of a large file had been thousands of lines)."""
    if len(lines) <= limit:
        return list(lines)
    return [*lines[:limit], f"... and {len(lines) - limit} more"]


MISSING: Any = object()  # a field absent from the line (None would be JSON null)
_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
_KINDS |= {list: "a list", dict: "an object", type(None): "null"}


class Sink:
    """Collects every error and note of one read, so the user sees them all at once."""

    def __init__(self) -> None:
        self.errors: list[InputError] = []
        self.problems: list[str] = []
        self.renamed: set[str] = set()  # the ``columns`` sources some object had

    def error(self, message: str, file: str, line: int | None, field: str | None = None) -> None:
        self.errors.append(InputError(message, file=file, line=line, field=field))

    def note(self, message: str, file: str, line: int | None = None) -> None:
        self.problems.append(f"{file}:{line}: {message}" if line else f"{file}: {message}")

    def raise_if_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            n = len(self.errors)
            shown = f" (first {MAX_ERRORS_SHOWN} shown)" if n > MAX_ERRORS_SHOWN else ""
            lines = "".join(f"\n  {e}" for e in self.errors[:MAX_ERRORS_SHOWN])
            files = {e.file for e in self.errors}
            file = files.pop() if len(files) == 1 else None
            raise InputError(f"{n} input errors{shown}:{lines}", file=file)


def kind(value: Any) -> str:
    """What a JSON value is, for messages: "a string", "a list", "null", ..."""
    return _KINDS.get(type(value), type(value).__name__)


def read_bytes(path: Path) -> bytes:
    """The file's bytes: a regular file, or a pipe (``<(zcat data.jsonl.gz)``); a device
    (/dev/zero, /dev/urandom) is refused: it never ends, and was read until memory ran out."""
    try:
        if stat.S_ISCHR(mode := path.stat().st_mode) or stat.S_ISBLK(mode):
            raise InputError("a device, not a file of lines", file=str(path))
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the file ({exc.strerror or exc})", file=str(path)) from None


def text_lines(path: Path, sink: Sink) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line; undecodable lines go to the sink."""
    data = read_bytes(path).removeprefix(codecs.BOM_UTF8)
    if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        sink.error("saved as UTF-16: save it as UTF-8 (one JSON object per line)", str(path), 1)
        return
    for n, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            sink.error(f"invalid UTF-8 (byte {exc.start + 1} of the line)", str(path), n)
            continue
        if text.strip():
            yield n, text


def json_lines(path: Path, sink: Sink) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line; what is not one JSON value per line
    goes to the sink: invalid JSON, nesting or numbers too large to read, lone surrogates, and
    a whole file that is one JSON array (JSON, not JSON Lines) as a single error."""
    lines = text_lines(path, sink)
    for n, text in lines:
        try:
            value = json.loads(text, object_pairs_hook=_once_each)
        except _Twice as exc:
            sink.error(
                f"key '{exc.key}' given twice in one object (one would be lost)", str(path), n
            )
            continue
        except json.JSONDecodeError as exc:
            if n == 1 and text.lstrip().startswith("[") and _array_file(path, sink):
                return
            what = exc.msg.removesuffix(" at")  # "Invalid control character at": one "at"
            sink.error(f"invalid JSON ({what} at column {exc.colno})", str(path), n)
            continue
        except RecursionError:
            sink.error("invalid JSON (nested too deeply to read)", str(path), n)
            continue
        except ValueError as exc:  # e.g. an integer beyond Python's 4300-digit limit
            sink.error(f"invalid JSON ({str(exc).split(';')[0]})", str(path), n)
            continue
        if _SURROGATE.search(text) and (where := _lone_surrogate(value)) is not None:
            sink.error("contains a lone UTF-16 surrogate (not valid text)", str(path), n, where)
            continue
        if n == 1 and isinstance(value, list) and value and isinstance(value[0], dict):
            sink.error(_ARRAY_HINT, str(path), n)
            return
        yield n, value


class _Twice(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, each key once (``json.loads`` keeps the last of two silently:
    a line's second "passages" had replaced its first without a word)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Twice(key)
            seen.add(key)
    return found


_INTEGER = re.compile(r"-?[0-9]+")


def is_integer(text: str) -> bool:
    """Whether a column of a text file (a TREC rank, a qrels grade) is a whole number in ASCII
    digits, as ``int`` reads it (``str.isdigit`` also takes "²", which ``int`` refuses)."""
    return _INTEGER.fullmatch(text) is not None


_ARRAY_HINT = (
    "the file is one JSON array, not JSON Lines (one JSON object per line); "
    "convert it with: jq -c '.[]' FILE > FILE.jsonl"
)
# A \u escape in the surrogate range; json.loads pairs valid ones, so only a lone one is left.
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _array_file(path: Path, sink: Sink) -> bool:
    """Whether the whole file is one (pretty-printed) JSON array; if so, say it once."""
    try:
        whole = json.loads(read_bytes(path).removeprefix(codecs.BOM_UTF8))
    except (ValueError, RecursionError):
        return False
    if not isinstance(whole, list):
        return False
    sink.error(_ARRAY_HINT, str(path), 1)
    return True


def _lone_surrogate(value: Any, at: str = "") -> str | None:
    """The dotted field holding a string that is not valid Unicode text, if any."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return at or "(value)"
        return None
    if not isinstance(value, dict | list):
        return None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        key_bad = isinstance(key, str) and _lone_surrogate(key) is not None
        name = f"{at}.{key}" if at else str(key)
        found = name if key_bad else _lone_surrogate(item, name)
        if found is not None:
            return found
    return None


class Row:
    """Checks the fields of one line; each problem goes to the sink with file:line and field."""

    def __init__(self, sink: Sink, file: str, line: int) -> None:
        self.sink, self.file, self.line, self.errors = sink, file, line, 0

    @property
    def ok(self) -> bool:
        return self.errors == 0

    def bad(self, field: str | None, message: str) -> None:
        self.sink.error(message, self.file, self.line, field)
        self.errors += 1

    def note(self, message: str) -> None:
        self.sink.note(message, self.file, self.line)

    def string(self, value: Any, field: str, *, required: bool = True) -> str | None:
        if value is MISSING or (value is None and not required):
            if required:
                self.bad(field, "missing")
            return None
        if not isinstance(value, str):
            self.bad(field, f"expected a string, got {kind(value)}")
            return None
        return value

    def nonblank(self, value: Any, field: str) -> str | None:
        text = self.string(value, field)
        if text is not None and not text.strip():
            self.bad(field, "is empty")
            return None
        return text

    def ident(self, value: Any, field: str) -> str | None:
        if value is MISSING:
            self.bad(field, "missing")
            return None
        text, problem = id_text(value)
        if problem:
            self.bad(field, problem)
        return text

    def number(self, value: Any, field: str) -> float | None:
        if value is None or value is MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.bad(field, f"expected a number, got {kind(value)}")
            return None
        if not math.isfinite(value):  # JSON's NaN, Infinity, 1e400: stored as null otherwise
            self.bad(field, f"expected a finite number, got {value}")
            return None
        return float(value)

    def listed(
        self, value: Any, field: str, item: Callable[[Any, str], str | None]
    ) -> list[str] | None:
        """A list checked item by item; None when absent or invalid (``ok`` tells which)."""
        if value is None or value is MISSING:
            return None
        if not isinstance(value, list):
            self.bad(field, f"expected a list, got {kind(value)}")
            return None
        out = [item(v, f"{field}[{i}]") for i, v in enumerate(value)]
        return None if None in out else [v for v in out if v is not None]

    def rename(self, obj: dict[str, Any], renames: Mapping[str, str], at: str) -> dict[str, Any]:
        """``obj`` with its keys renamed (``obj`` itself when nothing is renamed: the callers
        only read it); two keys that map to one name are an error."""
        if not renames:
            return obj
        self.sink.renamed.update(renames.keys() & obj.keys())
        out: dict[str, Any] = {}
        for key, value in obj.items():
            name = renames.get(key, key)
            if name in out:
                self.bad(at + name, f"given twice ('{key}' also maps to it; see columns)")
            out[name] = value
        return out


def objects(
    lines: Iterable[tuple[int, Any]], file: str, sink: Sink, renames: Mapping[str, str]
) -> Iterator[tuple[Row, dict[str, Any]]]:
    """Each line's :class:`Row` and its object, keys renamed by ``renames``; a line holding
    anything but a JSON object is an error on that line."""
    for n, obj in lines:
        row = Row(sink, file, n)
        if not isinstance(obj, dict):
            row.bad(None, f"expected a JSON object, got {kind(obj)}")
            continue
        yield row, row.rename(obj, renames, "")


def ordinary_mode() -> int:
    """The mode a plainly created file gets here: 0666 less the process's umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def id_text(value: Any) -> tuple[str | None, str | None]:
    """An id as text, or the problem with it: a string, or an integer of any kind (numpy's
    too; a float that is a whole number, as an integer column with a gap is in a DataFrame:
    1.0 is "1"); not a bool, None, another number or anything else, and not blank."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, str | numbers.Integral):
        return None, f"expected a string or integer id, got {kind(value)}"
    text = str(value) if isinstance(value, str) else str(int(value))
    if not text.strip():
        return None, "is empty"
    return text, None


def write_atomic(
    path: str | Path, data: bytes | str | Iterable[bytes], mode: int | None = None
) -> Path:
    """Write ``data`` (text as UTF-8, or byte chunks) to ``path`` through a temporary file in
    its folder, flushed and renamed over it; ``mode``: the file's permissions (default: a
    plainly created file's). An OSError names ``path`` (a full disk's has no file of its
    own), and leaves no temporary file."""
    target = Path(path)
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, str | bytes):
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            else:
                fh.writelines(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, ordinary_mode() if mode is None else mode)  # mkstemp's is 0600
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        if exc.filename is None or exc.filename == tmp:
            exc.filename = str(target)
        raise
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return target
