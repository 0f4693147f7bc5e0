"""End to end: `judge run` with the embedded judge — real llama.cpp server, real model.

2 queries x 3 passages, logprobs on. Runs in CI (never skipped there: see require_embedded).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from judge.cli.main import main
from tests.test_embedded import require_embedded

QUERIES = [
    {
        "query_id": "anaemia",
        "query": "signs of anaemia in puppies",
        "passages": [
            {"id": "a1", "text": "Anaemic puppies have pale gums, tire quickly and breathe fast."},
            {"id": "a2", "text": "Our pet shop sells collars in twelve colours."},
            {"id": "a3", "text": "Hookworms can cause blood loss and anaemia in young dogs."},
        ],
        "labels": {"a1": 3, "a2": 0, "a3": 1},
    },
    {
        "query_id": "battery",
        "query": "手机电池不耐用怎么办",
        "passages": [
            {"id": "b1", "text": "降低屏幕亮度、关闭后台应用刷新可以明显延长手机续航。"},
            {"id": "b2", "text": "今天的天气晴朗，适合去公园散步。"},
            {"id": "b3", "text": "电池健康低于 80% 时，更换电池是最直接的办法。"},
        ],
        "labels": {"b1": 3, "b2": 0, "b3": 2},
    },
]


def llama_servers() -> list[int]:
    """The llama.cpp servers this test process started (its children): another process on
    the machine may start and stop its own at any time."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                status = (entry / "status").read_text()
            except OSError:
                continue
            parent = next(
                (line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), ""
            )
            if b"llama_cpp" in cmdline and b"server" in cmdline and parent == str(os.getpid()):
                found.append(int(entry.name))
    return found


@pytest.mark.embedded
def test_judge_run_with_the_embedded_judge(tmp_path: Path) -> None:
    require_embedded()
    before = set(llama_servers())
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in QUERIES), "utf-8")
    out = tmp_path / "run"
    config = tmp_path / "e2e.toml"
    config.write_text(
        # The cascade's embedded LLM with its band open: the LLM judges every passage.
        Path("configs/cascade.toml")
        .read_text(encoding="utf-8")
        .replace("low = 0.5\nhigh = 0.5", "low = 0.0\nhigh = 1.0")
        + "\n[thresholds]\nmax_unparsed_rate = 1.0\n",
        encoding="utf-8",
    )
    code = main(
        [
            "run",
            str(config),
            str(data),
            "--out",
            str(out),
            "--sample",
            "0",
            "--cache",
            str(tmp_path / "cache.sqlite"),
            "--set",
            f'run.history="{tmp_path / "history.sqlite"}"',
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in (out / "verdicts.jsonl").read_text("utf-8").splitlines()]
    verdicts = [v for row in rows for v in row["verdicts"]]
    assert len(rows) == 2 and len(verdicts) == 6
    ok = [v for v in verdicts if v["status"] == "ok"]
    assert len(ok) >= 4, [v["raw"] for v in verdicts]
    assert all(v["status"] != "error" for v in verdicts)
    # Logprobs were on: every ok verdict has a probability of relevance in [0, 1].
    assert all(v["probability"] is not None and 0.0 <= v["probability"] <= 1.0 for v in ok)
    summary = json.loads((out / "summary.json").read_text("utf-8"))
    means = summary["engines"]["default"]["metrics"]
    assert means["relevancy_mean"]["mean"] is not None
    assert 0.0 <= means["relevancy_mean"]["mean"] <= 1.0
    assert means["rerank_max"]["mean"] is not None
    report = (out / "report.md").read_text("utf-8")
    assert "relevancy_mean" in report
    assert (out / "report.html").stat().st_size > 1000
    assert (out / "qrels.txt").read_text("utf-8").strip()
    # The server judge started is gone once the run is over.
    assert set(llama_servers()) - before == set()


@pytest.mark.embedded
def test_listwise_verdicts_of_the_embedded_judge_agree_with_their_own_probabilities() -> None:
    """Issue 19: with llama.cpp's default repeat penalty a list's verdicts flipped with position
    and contradicted the model's own P(yes). Listwise through the embedded server, the answer's
    JSON schema decoded as a grammar (it reaches llama-cpp-python only in its json_object
    spelling): one list answer per query covers every passage, and no verdict says "no" with
    P(yes) > 0.5 or "yes" with P(yes) < 0.5."""
    require_embedded()
    from judge.calling.limits import Limits
    from judge.judging.judge import Judge
    from judge.schema import SamplingParams

    params = SamplingParams(
        max_tokens=200, logprobs=True, top_logprobs=5, response_format="json_schema"
    )
    with Judge(
        provider="embedded",
        model="qwen2.5-coder-0.5b-instruct-q4",
        mode="listwise",
        reasons=False,
        params=params,
        # A loaded CI machine can take minutes per answer: a timeout here is not the subject.
        limits=Limits(timeout_s=900.0, max_attempts=1),
    ) as judge:
        query = QUERIES[0]
        verdicts = judge.judge(query["query"], query["passages"]).verdicts
        calls = judge.caller.stats.successes
    assert len(verdicts) == 3 and all(v.status == "ok" for v in verdicts), verdicts
    assert calls == 1  # one list answer, no re-ask, no pointwise fallback
    for v in verdicts:
        assert v.probability is not None
        assert (v.label == "yes") == (v.probability >= 0.5), (v.label, v.probability, v.raw)
