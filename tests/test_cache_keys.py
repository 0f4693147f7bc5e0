"""Cache keys made before rendering, and answers kept with their reading: a cached re-run
renders and parses nothing, yet every input that changes a request changes its key, and a
cache written by an older judge still answers (never wrongly)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from judge.calling.cache import Cache, Reading, Stored
from judge.config import load_config
from judge.judging.judge import Judge
from judge.judging.keys import passage_fields, template_sources
from judge.judging.prompts import list_templates, load_template
from judge.judging.verdicts import Parsed
from judge.providers.base import Completion, request_key
from judge.run.estimate import estimate
from judge.run.runner import run_async
from judge.schema import Passage, Query, SamplingParams, Scale, ScaleLabel, Usage
from tests.servers import ScriptedServer, verdict_json

QUERY = Query(
    query_id="q1",
    query="what is a kettle",
    engine="bm25",
    passages=(
        Passage(id="p1", text="A kettle boils water.", title="Kettles"),
        Passage(id="p2", text="Bananas are yellow.", score=3.5),
    ),
)


def _judge(url: str, cache: Path | None = None, **kwargs: Any) -> Judge:
    return Judge("local", "judge-test", base_url=url, cache=cache, **kwargs)


def _key_and_request(judge: Judge, query: Query = QUERY, repeat: int = 0) -> tuple[str, Any]:
    prompt = judge.asker.first_prompts(query)[0]
    return judge.caller.key(prompt, repeat), prompt.request


def _stored(path: Path) -> list[tuple[str, str | None, str | None]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT key, reading_tag, reading FROM answers").fetchall()
    conn.close()
    return rows


def test_a_cache_written_by_an_older_judge_still_answers_and_is_keyed_anew(
    server: ScriptedServer, tmp_path: Path
) -> None:
    path = tmp_path / "cache.sqlite"
    older = Cache(path)
    judge = _judge(server.openai_base_url)
    identity = judge.caller.chat.identity if judge.caller.chat else ""
    # As judge stored answers before prompt digests: under the rendered request's key.
    for request in judge.first_requests(QUERY):
        answer = Completion(text=verdict_json("no"), usage=Usage(prompt_tokens=7))
        older.put(request_key(identity, request, 0), answer, kind="chat", model="judge-test")
    older.close()

    with _judge(server.openai_base_url, path) as again:
        jq = again.judge(QUERY)
        keys = [again.caller.key(p, 0) for p in again.asker.first_prompts(QUERY)]
    assert [v.label for v in jq.verdicts] == ["no", "no"]
    assert all(v.cached for v in jq.verdicts) and server.requests == []
    cache = Cache(path)
    named = [cache.get_stored(key, Completion, alias=True) for key in keys]
    cache.close()
    # Named by their digests from now on, and read once: the next run renders and parses nothing.
    assert all(found is not None and found.reading is not None for found in named)

    with _judge(server.openai_base_url, path) as third:
        assert [v.label for v in third.judge(QUERY).verdicts] == ["no", "no"]
    assert server.requests == []


def _scale(description: str) -> Scale:
    return Scale(
        name="binary",
        threshold=1,
        labels=(
            ScaleLabel(name="no", grade=0, description="not useful"),
            ScaleLabel(name="yes", grade=1, description=description),
        ),
    )


def _templates(tmp_path: Path, partial: str) -> Path:
    """A template directory whose pointwise template includes a partial with ``partial``."""
    folder = tmp_path / f"t-{abs(hash(partial))}"
    folder.mkdir()
    (folder / "note.j2").write_text(partial, encoding="utf-8")
    (folder / "mine.pointwise.en.j2").write_text(
        "{% block user %}{% include 'note.j2' %} {{ query }} {{ fence(passage) }} "
        "{{ scale.labels | map(attribute='description') | join('/') }}{% endblock %}",
        encoding="utf-8",
    )
    return folder


def test_every_input_that_changes_a_request_changes_its_key(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/v1"
    own = {"template": "mine.pointwise.en", "template_dir": _templates(tmp_path, "Judge it.")}
    base = _key_and_request(_judge(url, **own))
    p1 = QUERY.passages[0]
    variants: dict[str, tuple[str, Any]] = {
        "included template": _key_and_request(
            _judge(url, template="mine.pointwise.en", template_dir=_templates(tmp_path, "Judge!"))
        ),
        "built-in template": _key_and_request(_judge(url)),
        "scale": _key_and_request(_judge(url, scale=_scale("useful"), **own)),
        "params": _key_and_request(_judge(url, params=SamplingParams(temperature=0.5), **own)),
        "model": _key_and_request(Judge("local", "other", base_url=url, **own)),
        "query text": _key_and_request(
            _judge(url, **own), QUERY.model_copy(update={"query": "what is a pot"})
        ),
        "passage text": _key_and_request(
            _judge(url, **own),
            QUERY.model_copy(update={"passages": (p1.model_copy(update={"text": "Hot."}),)}),
        ),
        "passage title": _key_and_request(
            _judge(url, **own),
            QUERY.model_copy(update={"passages": (p1.model_copy(update={"title": None}),)}),
        ),
    }
    for what, (key, request) in variants.items():
        assert key != base[0], what
        assert request != base[1], what
    # A pointwise prompt does not show the passage's id: one text under two ids is one request
    # (the key may still differ; a key that misses finds the answer by the rendered request).
    renamed = QUERY.model_copy(update={"passages": (p1.model_copy(update={"id": "p9"}),)})
    assert _key_and_request(_judge(url, **own), renamed)[1] == base[1]
    short = _key_and_request(_judge(url, reasons=False))
    assert short[0] != variants["built-in template"][0]  # the answer shape
    assert short[1] != variants["built-in template"][1]
    judge = _judge(url, **own)
    assert judge.caller.key(judge.asker.first_prompts(QUERY)[0], 1) != base[0]  # the repeat
    for other in (
        Judge("local", "judge-test", base_url="http://127.0.0.1:10/v1", **own),
        Judge("local", "judge-test", base_url=url, extra_body={"top_k": 5}, **own),
    ):
        assert _key_and_request(other)[0] != base[0]  # the provider's identity

    # What the template never reads is no part of the key: the same passage from two engines,
    # with their own scores and query ids, is one request and one answer.
    same = QUERY.model_copy(
        update={
            "query_id": "other",
            "engine": "dense",
            "labels": {"p1": 1},
            "passages": (p1.model_copy(update={"score": 0.1, "url": "https://x.invalid"}),),
        }
    )
    assert _key_and_request(_judge(url, **own), same) == base


def test_a_template_reading_more_of_a_passage_keys_on_more(tmp_path: Path) -> None:
    env = load_template("binary.pointwise.en").template.environment
    assert passage_fields(env, ["{{ fence(passage) }} {{ passage.url }}"]) == (
        "id",
        "text",
        "title",
        "url",
    )
    everything = tuple(Passage.model_fields)
    for opaque in ("{{ passage }}", "{% set p = passage %}", "{{ passages[0].text }}"):
        assert passage_fields(env, [opaque]) == everything, opaque
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "scored.pointwise.en.j2").write_text(
        "{% block user %}{{ query }} {{ fence(passage) }} score {{ passage.score }} "
        "{{ scale.name }}{% endblock %}",
        encoding="utf-8",
    )
    judge = _judge("http://127.0.0.1:9/v1", template="scored.pointwise.en", template_dir=folder)
    rescored = QUERY.model_copy(
        update={"passages": (QUERY.passages[0].model_copy(update={"score": 9.0}),)}
    )
    assert _key_and_request(judge, rescored)[0] != _key_and_request(judge)[0]


# The relevance templates: their first-round prompts are keyed by digests before rendering.
# The coverage and credibility templates (nuggets, support, credibility) are keyed by the
# rendered request, so they may read more (credibility reads the url).
RELEVANCE_TEMPLATES = [n for n in list_templates() if n.split(".")[0] in ("binary", "graded")]


def test_every_relevance_template_is_covered_by_the_digest_check() -> None:
    assert len(RELEVANCE_TEMPLATES) == 8


@pytest.mark.parametrize("name", RELEVANCE_TEMPLATES)
def test_a_builtin_template_sees_a_query_s_text_and_a_passage_s_id_title_and_text(
    name: str,
) -> None:
    """What the digest leaves out must not reach the prompt (judging/keys.py relies on it)."""
    template = load_template(name)
    env = template.template.environment
    assert passage_fields(env, template_sources(template).values()) == ("id", "text", "title")
    other = QUERY.model_copy(
        update={
            "query_id": "q2",
            "engine": "dense",
            "labels": {"p1": 1},
            "expected_ids": ("p1",),
            "source": "x.jsonl:3",
            "passages": tuple(
                p.model_copy(update={"score": 1.0, "url": "https://x.invalid", "truncated_from": 9})
                for p in QUERY.passages
            ),
        }
    )
    scale = Scale.named("graded" if name.startswith("graded") else "binary")
    if template.mode == "pointwise":
        assert template.render_pointwise(QUERY, QUERY.passages[0], scale) == (
            template.render_pointwise(other, other.passages[0], scale)
        )
    else:
        assert template.render_listwise(QUERY, QUERY.passages, scale) == (
            template.render_listwise(other, other.passages, scale)
        )


def test_a_stored_reading_is_trusted_only_under_its_own_parser_tag(
    make_server: Any, tmp_path: Path
) -> None:
    server = make_server(responder=lambda _request: verdict_json("yes"))
    path = tmp_path / "cache.sqlite"
    with _judge(server.openai_base_url, path) as judge:
        assert [v.label for v in judge.judge(QUERY).verdicts] == ["yes", "yes"]
        identity = judge.caller.chat.identity if judge.caller.chat else ""
        rendered = [request_key(identity, r, 0) for r in judge.first_requests(QUERY)]
    rows = _stored(path)
    # Stored by the rendered request's content address, as every judge version looks it up.
    assert sorted(key for key, _, _ in rows) == sorted(rendered)
    assert len(rows) == 2 and all(tag and reading for _, tag, reading in rows)
    tag = rows[0][1]
    assert tag is not None

    def keep(reading: Reading) -> None:
        cache = Cache(path)
        for key, _, _ in rows:
            cache.set_reading(key, reading)
        cache.close()
        # Whole queries' verdicts read from the old readings (judging/memo.py) go too: a
        # parser of other code is another judge version, which never finds this one's sets.
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM verdict_sets")
        conn.close()

    # The reading says "no" while the stored answer says "yes": a hit takes the reading as is.
    keep(Reading(tag, Parsed(label="no", grade=0, reason="kept").model_dump_json()))
    with _judge(server.openai_base_url, path) as judge:
        assert [v.reason for v in judge.judge(QUERY).verdicts] == ["kept", "kept"]
    # Read by another parser (another version's code): never trusted, the answer is read again.
    keep(Reading("another parser", Parsed(label="no", grade=0).model_dump_json()))
    with _judge(server.openai_base_url, path) as judge:
        assert [v.label for v in judge.judge(QUERY).verdicts] == ["yes", "yes"]
    assert {t for _, t, _ in _stored(path)} == {tag}
    assert len(server.requests) == 2


def test_a_cache_file_from_before_readings_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE answers (key TEXT PRIMARY KEY, kind TEXT NOT NULL, model TEXT NOT NULL,"
            " value TEXT NOT NULL, created REAL NOT NULL);"
        )
        conn.execute(
            "INSERT INTO answers VALUES ('old', 'chat', 'm', ?, 0)",
            (Completion(text="yes").model_dump_json(),),
        )
    conn.close()
    cache = Cache(path)
    assert cache.get_stored("old", Completion) == Stored(Completion(text="yes"), None, "old")
    reading = Reading("t", "{}")
    cache.put("new", Completion(text="no"), kind="chat", model="m", reading=reading, alias="a")
    assert cache.get_stored("a", Completion, alias=True) == Stored(
        Completion(text="no"), reading, "new"
    )
    cache.close()
    # An older judge still writes to it the way it always did.
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT OR REPLACE INTO answers(key, kind, model, value, created) "
            "VALUES ('new', 'chat', 'm', ?, 1)",
            (Completion(text="x").model_dump_json(),),
        )
    conn.close()
    cache = Cache(path)
    assert cache.get_stored("a", Completion, alias=True) == Stored(
        Completion(text="x"), None, "new"
    )
    cache.close()


def test_a_dry_run_counts_the_answers_a_run_would_find(
    server: ScriptedServer, tmp_path: Path
) -> None:
    config = load_config(
        None,
        {
            "judge.provider": "local",
            "judge.model": "judge-test",
            "provider.base_url": server.openai_base_url,
            "run.cache": str(tmp_path / "cache.sqlite"),
        },
    )
    before = estimate(config, [QUERY], tmp_path / "new")
    assert (before.calls, before.cached_calls) == (2, 0)
    asyncio.run(run_async(config, [QUERY], tmp_path / "first"))
    after = estimate(config, [QUERY], tmp_path / "new")
    assert (after.calls, after.cached_calls, after.prompt_tokens) == (2, 2, 0)
