"""``judge run --ray`` on a real local Ray instance (two CPUs, started once for this module)
against loopback servers through the real openai SDK: the same verdicts, summary and cache as a
single-process run; the budget a hard cap across shards; a killed worker or driver resumed,
re-paying only the calls in flight; no Ray process left behind.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from judge.cli.main import main
from judge.config import load_config
from judge.data.nuggets import NUGGETS_FILE, read_nuggets
from judge.data.results import RESULTS_FILE
from judge.run.shard_files import SHARD_FILE, SHARDS_DIR
from judge.run.shards import ShardTask, judge_shard, plan_shards, shard_of
from judge.schema import Passage, Query
from tests.aspect_wire import aspect_responder
from tests.servers import ScriptedServer
from tests.test_budget import EACH, EXIT_BUDGET, PRICE, Metered
from tests.test_nuggets_run import EXPECTED, by_unit, kinds
from tests.test_nuggets_run import setup as nugget_setup
from tests.test_runner import CountingResponder, verdict_labels, write_config, write_dataset

EXIT_INCOMPLETE = 3
# Summary parts that must match a single-process run's (not: when it was made, how it ran).
SAME = ("counts", "usage", "engines", "stability", "health", "queries", "thresholds")


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, from /proc (a process's children file per thread)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie has ended)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _gone(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    """Wait for ``pids`` to end; kill (by PID) and return those that did not."""
    deadline = time.monotonic() + timeout_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive(pids)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One local Ray instance for the module, in a home of its own (Ray writes a token there,
    and its workers keep the environment they start with); every process it started is gone
    after it stops."""
    home = tmp_path_factory.mktemp("ray-home")
    # Other fixtures' processes (a loopback server of another module) are not Ray's.
    before = _descendants(os.getpid())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(home))
        env.setenv("XDG_CACHE_HOME", str(home / ".cache"))
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "RAY_ADDRESS"):
            env.delenv(name, raising=False)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    started = _descendants(os.getpid()) - before
    assert started, "ray.init started no process"
    try:
        yield
    finally:
        ray.shutdown()
        assert not _gone(started), "Ray processes were left running after ray.shutdown()"


def _summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return data


def _distinct(server: ScriptedServer) -> int:
    """How many different requests ``server`` was sent (a retried one counts once)."""
    return len({json.dumps(r.body, sort_keys=True) for r in server.requests})


def _counts_what_the_server_saw(run: dict[str, Any], server: ScriptedServer) -> None:
    """The summary's request count is the server's: exactly, when no attempt failed; an
    attempt that failed after connecting (a timeout on a starved machine) may or may not
    have been read by the server, so then it is bounded by the failures."""
    seen, failed = len(server.requests), sum(run["errors_by_kind"].values())
    assert seen <= run["requests"] <= seen + failed, (seen, run)
    if not failed:
        assert run["requests"] == seen


def _reference_run(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, dataset: Path
) -> tuple[Path, ScriptedServer]:
    """A single-process run of ``dataset`` with its own server and cache: its run directory
    and the server it asked."""
    server = make_server()
    config = write_config(tmp_path / "ref.toml", server, tmp_path / "ref-cache.sqlite")
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "ref")]) == 0
    return tmp_path / "ref", server


def _reference(make_server: Callable[..., ScriptedServer], tmp_path: Path, dataset: Path) -> Path:
    """A single-process run's directory (see :func:`_reference_run`)."""
    return _reference_run(make_server, tmp_path, dataset)[0]


def test_a_query_stays_in_one_shard_under_a_hash_stable_across_processes() -> None:
    rows = [
        Query(
            query_id=f"q{i}",
            query=f"query {i}",
            engine=engine,
            passages=(Passage(id="p", text="t"),),
        )
        for i in range(40)
        for engine in ("bm25", "dense")
    ]
    plan = plan_shards(rows, 4, done={("q0", "bm25", 0), ("q0", "dense", 0)}, repeats=1)
    owners: dict[str, set[int]] = {}
    for k, shard in enumerate(plan):
        for q in shard:
            owners.setdefault(q.query_id, set()).add(k)
            assert shard_of(q.query_id, 4) == k
    assert all(len(shards) == 1 for shards in owners.values())  # every engine of a query together
    assert "q0" not in owners and len(owners) == 39  # a finished query goes nowhere
    assert all(len([q for q in shard if q.query_id == "q1"]) in (0, 2) for shard in plan)
    assert min(len(shard) for shard in plan) > 0
    # Pinned: Python's own str hash changes with every process; a shard's queries must not.
    assert [shard_of(f"q{i}", 4) for i in range(12)] == [1, 0, 2, 1, 0, 0, 3, 2, 3, 3, 2, 0]
    assert shard_of("q1", 1000) == 696


@pytest.mark.slow
def test_ray_run_matches_a_single_process_run_and_fills_the_users_cache(
    cluster: None, make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    dataset = Path(__file__).resolve().parent.parent / "datasets" / "sample.jsonl"
    reference, reference_server = _reference_run(make_server, tmp_path, dataset)
    reference_asked = _distinct(reference_server)

    server = make_server()
    cache = tmp_path / "cache.sqlite"
    config = write_config(tmp_path / "run.toml", server, cache)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--ray", "--shards", "3"]) == 0

    assert verdict_labels(out) == verdict_labels(reference)
    sharded, single = _summary(out), _summary(reference)
    for part in SAME:
        assert sharded[part] == single[part], part
    assert (out / "report.md").is_file() and (out / "qrels.txt").is_file()
    assert sorted((out / "qrels.txt").read_text().splitlines()) == sorted(
        (reference / "qrels.txt").read_text().splitlines()
    )
    # The shards asked what one process asks (a passage two engines returned, once), and the
    # summary counts what the server saw.
    assert _distinct(server) == reference_asked
    _counts_what_the_server_saw(sharded["run"], server)
    paid = len(server.requests)
    assert not (out / SHARDS_DIR).exists()  # folded into the run directory

    # The shards' answers are in the user's cache: a later single-process run pays nothing,
    # and a later Ray run's shards read it too.
    again = tmp_path / "again"
    assert main(["run", str(config), "--out", str(again)]) == 0
    assert len(server.requests) == paid
    assert verdict_labels(again) == verdict_labels(reference)
    third = tmp_path / "third"
    assert main(["run", str(config), "--out", str(third), "--ray", "--shards", "2"]) == 0
    assert len(server.requests) == paid
    assert _summary(third)["run"]["requests"] == 0
    assert verdict_labels(third) == verdict_labels(reference)


@pytest.mark.slow
def test_nugget_sets_on_ray_are_made_once_per_query_as_in_one_process(
    cluster: None, make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    runs = {}
    for name, ray_args in (("one", []), ("ray", ["--ray", "--shards", "3"])):
        (tmp_path / name).mkdir()
        server = make_server(responder=aspect_responder())
        config = nugget_setup(tmp_path / name, server)
        out = tmp_path / name / "out"
        assert main(["run", str(config), "--out", str(out), *ray_args]) == 0
        # One nugget set per query id though q1 and q2 went to different shards (2 and 1).
        assert kinds(server) == EXPECTED, name
        runs[name] = out
    assert {shard_of(q, 3) for q in ("q1", "q2")} == {1, 2}
    assert read_nuggets(runs["ray"] / NUGGETS_FILE) == read_nuggets(runs["one"] / NUGGETS_FILE)
    one, sharded = by_unit(runs["one"]), by_unit(runs["ray"])
    assert sharded.keys() == one.keys()
    for unit, jq in one.items():
        got = sharded[unit]
        assert (got.coverage, got.credibility, got.metrics) == (
            jq.coverage,
            jq.credibility,
            jq.metrics,
        )
    assert _summary(runs["ray"])["coverage"] == _summary(runs["one"])["coverage"]


@pytest.mark.slow
def test_budget_is_a_hard_cap_across_shards_and_a_larger_one_resumes(
    cluster: None,
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    metered = Metered()
    server = make_server(responder=metered, latency=0.02)
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries=40, n_passages=6)
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {
            "dataset": {"path": str(dataset), "label_scale": "binary"},
            "run": {"concurrency": 16, "max_attempts": 4},
            'prices."judge-test"': PRICE,
        },
    )
    out = tmp_path / "out"
    cap = 0.1  # room for 76 of the 240 calls
    args = ["run", str(config), "--out", str(out), "--ray", "--shards", "4"]
    assert main([*args, "--max-cost", str(cap)]) == EXIT_BUDGET
    err = capsys.readouterr().err
    assert "cost budget reached" in err and "across the shards" in err
    assert 0 < metered.billed * EACH <= cap
    assert len(server.requests) == metered.billed  # nothing failed: every request was billed
    first = metered.billed
    partial = verdict_labels(out)
    assert 0 < len(partial) < 240

    assert main([*args, "--max-cost", "10"]) == 0
    final = verdict_labels(out)
    assert len(final) == 240 and {k: final[k] for k in partial} == partial
    # Every passage paid for exactly once over the two runs: what the first run's half-judged
    # units had been answered came from the cache.
    assert metered.billed == 240 and first > 0


@pytest.mark.slow
def test_a_killed_worker_loses_nothing_and_its_rerun_pays_only_calls_in_flight(
    cluster: None, make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    per_shard, n_queries, n_passages = 2, 8, 12
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries, n_passages)
    counting = CountingResponder()
    server = make_server(responder=counting, latency=0.05)
    # concurrency 4 split between the two shards: two calls in flight each.
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        # No hedging: every request paid twice must be the killed worker's call in flight.
        {"run": {"concurrency": 2 * per_shard, "adaptive_concurrency": False, "hedge_share": 0.0}},
    )
    out = tmp_path / "out"
    args = ["run", str(config), str(dataset), "--out", str(out), "--ray", "--shards", "2"]
    code: list[int] = []
    driver = threading.Thread(target=lambda: code.append(main(args)))
    driver.start()
    try:
        victim = _kill_a_shard_halfway(out, counting, n_passages)
    finally:
        driver.join(timeout=120)
    assert not driver.is_alive(), "the driver did not end after its worker was killed"
    assert code == [EXIT_INCOMPLETE]
    assert not (out / SHARDS_DIR).exists(), "the dead shard's work was not folded back"
    kept = verdict_labels(out)
    assert any(key[0] in victim for key in kept), "the killed shard's finished units were lost"
    paid_before = sum(counting.answered.values())

    assert main(args) == 0
    reference = _reference(make_server, tmp_path, dataset)
    final = verdict_labels(out)
    assert final == verdict_labels(reference) and len(final) == n_queries * n_passages
    assert {k: final[k] for k in kept} == kept
    unique = len(counting.answered)
    assert unique == n_queries * n_passages
    assert sum(counting.answered.values()) > paid_before
    # Only the killed worker's calls in flight were paid twice.
    assert sum(n - 1 for n in counting.answered.values()) <= per_shard


def _kill_a_shard_halfway(out: Path, counting: CountingResponder, n_passages: int) -> set[str]:
    """SIGKILL the worker of a shard that has written one query and is judging more; return
    that shard's query ids."""
    deadline = time.monotonic() + 90
    while True:
        assert time.monotonic() < deadline, "no shard wrote a query"
        for record in (out / SHARDS_DIR).glob(f"*/{SHARD_FILE}"):
            results = record.parent / RESULTS_FILE
            if results.exists() and results.read_bytes().count(b"\n") >= 1:
                shard = json.loads(record.read_text(encoding="utf-8"))
                lines = results.read_text(encoding="utf-8").splitlines()
                os.kill(shard["pid"], signal.SIGKILL)
                assert sum(counting.answered.values()) < 8 * n_passages  # killed halfway
                return {json.loads(line)["query"]["query_id"] for line in lines}
        time.sleep(0.02)


def _start_driver(args: list[str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen(
        [sys.executable, "-m", "judge", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def _when_paid(proc: subprocess.Popen[bytes], counting: CountingResponder, calls: int) -> None:
    deadline = time.monotonic() + 120
    while sum(counting.answered.values()) < calls:
        assert proc.poll() is None, "judge run --ray ended before it could be stopped"
        assert time.monotonic() < deadline, "judge run --ray asked too little"
        time.sleep(0.02)


def _named(pids: set[int], *names: str) -> set[int]:
    """Those of ``pids`` whose command line names one of ``names``."""
    found = set()
    for pid in pids:
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(name.encode() in line for name in names):
            found.add(pid)
    return found


@pytest.mark.slow
def test_a_stopped_or_killed_driver_loses_nothing_and_leaves_no_ray_worker_paying(
    cluster: None, make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    # A slow server and a short grace period: the stops land with most units left to judge.
    per_shard, n_queries, n_passages = 2, 24, 6
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries, n_passages)
    counting = CountingResponder()
    server = make_server(responder=counting, latency=0.2)
    run = {"concurrency": 2 * per_shard, "adaptive_concurrency": False, "grace_s": 1.0}
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", {"run": run})
    out = tmp_path / "out"
    args = ["run", str(config), str(dataset), "--out", str(out), "--ray", "--shards", "2"]

    # SIGTERM: the shards stop as on Ctrl-C, what they finished is folded back, Ray stops.
    proc = _start_driver(args)
    try:
        _when_paid(proc, counting, n_passages)
        started = _descendants(proc.pid)
        services = _named(started, "raylet", "gcs_server")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == EXIT_INCOMPLETE
    finally:
        proc.kill()
        proc.wait()
        left = _gone(started)
    assert services, "the driver started no Ray instance"
    assert not left, "Ray processes outlived a driver stopped by SIGTERM"
    assert not (out / SHARDS_DIR).exists()
    stopped = verdict_labels(out)
    assert 0 < len(stopped) < n_queries * n_passages

    # SIGKILL: nothing runs in the driver, but the cluster it started dies with it; the shards'
    # work stays where the rerun finds it.
    proc = _start_driver(args)
    try:
        _when_paid(proc, counting, sum(counting.answered.values()) + n_passages)
        started = _descendants(proc.pid)
        paying = _named(started, "raylet", "gcs_server", "judge-shard")
        proc.kill()
    finally:
        proc.wait()
    left = _gone(paying)
    _gone(started, 0.0)  # Ray's agents end on their own a minute later; not left to linger
    assert paying and not left, "Ray's workers or services outlived their killed driver"
    assert (out / SHARDS_DIR).is_dir()
    paid_before = sum(counting.answered.values())

    assert main(args) == 0  # on the module's Ray instance: a Ray already running is used
    reference = _reference(make_server, tmp_path, dataset)
    final = verdict_labels(out)
    # What the stopped run answered stays; the passages its units in flight had not sent yet
    # (no label: provider errors, "not sent") were asked by the rerun.
    answered = {k: v for k, v in stopped.items() if v is not None}
    assert final == verdict_labels(reference) and {k: final[k] for k in answered} == answered
    assert len(counting.answered) == n_queries * n_passages
    assert sum(counting.answered.values()) > paid_before
    # Paid twice, at most: the calls in flight when the grace period ran out, and at the kill.
    assert sum(n - 1 for n in counting.answered.values()) <= 2 * 2 * per_shard


def test_without_ray_installed_the_run_stops_in_one_line_before_any_call(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets without the extra
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'judge[ray]'" in err[0], err
    assert server.requests == []


@pytest.mark.parametrize(
    ("extra", "tables", "says"),
    [
        (["--ray", "--batch"], {"judge": {"provider": "openai"}}, "use --batch or --ray, not both"),
        (["--ray", "datasets/sample.jsonl"], {}, "is not a Ray address"),
        (
            ["--ray"],
            {
                "judge.cascade": {"max_error": 0.1},
                "rerank": {"provider": "rerank", "model": "r", "base_url": "http://127.0.0.1:9"},
            },
            "a shard sees only its part",
        ),
        # Nothing listens there: ray.init had retried it for ten minutes, deaf to Ctrl-C.
        (["--ray", "127.0.0.1:1"], {}, "run.ray: cannot reach Ray at '127.0.0.1:1'"),
    ],
    ids=["batch", "address", "cascade", "nobody-listens"],
)
def test_what_shards_cannot_do_is_refused_before_any_call(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_key: str,
    extra: list[str],
    tables: dict[str, dict[str, Any]],
    says: str,
) -> None:
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", tables)
    code = main(["run", str(config), "--out", str(tmp_path / "out"), *extra])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert server.requests == []


def test_judge_and_its_other_commands_never_import_ray(tmp_path: Path) -> None:
    code = (
        "import sys, judge, judge.cli.main as cli, judge.cli.ray, judge.run.ray_run\n"
        "cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_worker_without_the_run_directory_or_with_another_judge_says_so_in_one_line(
    server: ScriptedServer, tmp_path: Path
) -> None:
    config = load_config(write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite"))
    (tmp_path / "here").mkdir()
    task = ShardTask(
        index=1,
        shards=2,
        config=config,
        queries=(),
        shard_dir=str(tmp_path / "elsewhere"),
        user_cache=str(tmp_path / "cache.sqlite"),
    )
    missing = judge_shard(task)
    assert missing.exit_code == 2 and missing.error is not None
    assert "is not on this node" in missing.error and "\n" not in missing.error
    other = judge_shard(
        task.model_copy(update={"shard_dir": str(tmp_path / "here"), "version": "0"})
    )
    assert other.exit_code == 2 and other.error is not None and "judge 0" in other.error
    assert server.requests == []


def test_a_shard_splits_a_remote_providers_concurrency_but_not_a_local_models(
    tmp_path: Path,
) -> None:
    """Shards running at once share a remote endpoint's calls in flight (together they make
    what the config allows); a model every shard runs itself (the embedded judge, the embedded
    reranker) keeps its whole concurrency in each."""
    from judge.run.shards import shard_config

    def shard(provider: str, rerank: str) -> Any:
        values: dict[str, Any] = {
            "judge.provider": provider,
            "judge.model": "m",
            "run.concurrency": 12,
            "provider.concurrency": 9,
            "rerank.provider": rerank,
            "rerank.model": "r",
            "rerank.concurrency": 6,
        }
        share = {"cost": 0.0, "tokens": 0, "cache": tmp_path / "c.sqlite"}
        return shard_config(load_config(None, values), 3, cpus=1, **share)

    remote = shard("openai", "cohere")
    assert (remote.run.concurrency, remote.provider.concurrency) == (4, 3)
    assert remote.rerank.concurrency == 2 and remote.provider.options is None
    local = shard("embedded", "embedded-rerank")
    assert (local.run.concurrency, local.provider.concurrency) == (12, 9)
    assert local.rerank.concurrency == 6 and local.provider.options == {"n_threads": 1}


def test_an_embedded_shard_asks_ray_for_the_cpus_its_server_uses(
    cluster: None, tmp_path: Path
) -> None:
    """The embedded judge's llama.cpp server runs a thread per CPU it is given: a shard asks
    Ray for that many (every CPU of the largest node unless n_threads says), so Ray never puts
    two servers on the same cores; other providers' shards ask for one."""
    from judge.run.shards import shard_config, shard_cpus

    def config(provider: str, **options: Any) -> Any:
        values: dict[str, Any] = {"judge.provider": provider, "judge.model": "m"}
        if provider == "local":
            values["provider.base_url"] = "http://127.0.0.1:9/v1"
        if options:
            values["provider.options"] = options
        return load_config(None, values)

    embedded = config("embedded")
    assert shard_cpus(embedded) == 2  # the module's local Ray instance has two CPUs
    share = {"cost": 0.0, "tokens": 0, "cache": tmp_path / "c.sqlite"}
    shard = shard_config(embedded, 2, cpus=2, **share)
    assert shard.provider.options == {"n_threads": 2}
    assert shard_cpus(config("embedded", n_threads=1, n_ctx=2048)) == 1
    kept = shard_config(config("embedded", n_threads=1, n_ctx=2048), 2, cpus=1, **share)
    assert kept.provider.options == {"n_threads": 1, "n_ctx": 2048}
    remote = config("local")
    assert shard_cpus(remote) == 1
    assert shard_config(remote, 2, cpus=1, **share).provider.options is None
