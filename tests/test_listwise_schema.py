"""A listwise judge with ``response_format = "json_schema"`` sends the listwise schema with its
list call and the pointwise schema with its pointwise fallback (it used to send the listwise
schema to both, so every fallback passage came back unparsed)."""

from __future__ import annotations

import json
from typing import Any

from judge.calling.limits import Limits
from judge.judging.judge import Judge
from judge.judging.prompts import AnswerShape, json_schema_for
from judge.schema import SamplingParams, Scale
from tests.servers import Item, Recorded, ScriptedServer
from tests.wire import Answer

PASSAGES = ["Kettles boil water.", "Bananas are yellow.", "An electric kettle heats water fast."]


def schema_of(request: Recorded) -> dict[str, Any]:
    fmt = request.body["response_format"]
    assert fmt["type"] == "json_schema"
    schema: dict[str, Any] = fmt["json_schema"]["schema"]
    return schema


def answer_by_schema(request: Recorded) -> Item:
    """Answers in the shape the request's schema asks for; a list answer covers only the
    first passage it shows (id "1": list prompts number their passages), so the first list
    call settles one passage, the second another, and the last goes pointwise."""
    properties = schema_of(request)["properties"]
    if "verdicts" in properties:
        first = request.prompt.split('<passage id="1">')[1].split("</passage>")[0]
        label = "yes" if "kettle" in first.lower() else "no"
        item = {"id": "1", "reason": "read the first", "verdict": label}
        return Answer(text=json.dumps({"verdicts": [item]}))
    if "verdict" in properties:
        passage = request.prompt.split("<passage>")[-1].split("</passage>")[0]
        label = "yes" if "kettle" in passage.lower() else "no"
        return Answer(text=json.dumps({"reason": "read it", "verdict": label}))
    raise AssertionError(f"unexpected schema {properties}")


def test_the_pointwise_fallback_of_a_listwise_judge_sends_the_pointwise_schema() -> None:
    with ScriptedServer(responder=answer_by_schema) as srv:
        with Judge(
            provider="local",
            model="judge-model",
            base_url=srv.openai_base_url,
            mode="listwise",
            params=SamplingParams(response_format="json_schema", max_tokens=256),
            limits=Limits(max_attempts=2, backoff_base_s=0.01, timeout_s=10.0),
        ) as judge:
            jq = judge.judge("what does a kettle do?", PASSAGES)
        shapes = [sorted(schema_of(r)["properties"]) for r in srv.requests]
    assert [v.status for v in jq.verdicts] == ["ok", "ok", "ok"]
    assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]
    # The list call, a second list call for the two it left out, then one call per passage.
    assert shapes[0] == ["verdicts"]
    # Each list call's schema names its own passages' ids and asks for exactly one entry each.
    properties = [schema_of(r)["properties"] for r in srv.requests]
    lists = [p["verdicts"] for p in properties if "verdicts" in p]
    assert lists[0]["items"]["properties"]["id"]["enum"] == ["1", "2", "3"]
    assert lists[0]["minItems"] == lists[0]["maxItems"] == 3
    assert lists[1]["items"]["properties"]["id"]["enum"] == ["1", "2"]  # positions, renumbered
    assert lists[1]["minItems"] == lists[1]["maxItems"] == 2
    pointwise = [s for s in shapes if s != ["verdicts"]]
    assert pointwise and all(s == ["reason", "verdict"] for s in pointwise)


def test_a_json_object_spelling_sends_the_schema_the_way_llama_cpp_python_reads_it() -> None:
    """llama-cpp-python's server (the embedded judge's) rejects ``"type": "json_schema"`` with
    HTTP 500; it takes ``{"type": "json_object", "schema": ...}`` and decodes by that schema.
    Without it a small model copied passage text into the "verdict" of a list answer."""
    seen: list[dict[str, Any]] = []

    def answer(request: Recorded) -> Item:
        fmt = request.body["response_format"]
        seen.append(fmt)
        assert fmt["type"] == "json_object"
        verdict = fmt["schema"]["properties"]["verdicts"]["items"]["properties"]["verdict"]
        assert sorted(verdict["enum"]) == ["no", "yes"]
        items = [{"id": str(i), "verdict": "yes" if i != 2 else "no"} for i in (1, 2, 3)]
        return Answer(text=json.dumps({"verdicts": items}))

    with ScriptedServer(responder=answer) as srv:
        with Judge(
            provider="llamacpp",
            model="judge-model",
            base_url=srv.openai_base_url,
            schema_spelling="json_object",
            mode="listwise",
            reasons=False,
            params=SamplingParams(response_format="json_schema", max_tokens=256),
            limits=Limits(max_attempts=1, timeout_s=10.0),
        ) as judge:
            jq = judge.judge("what does a kettle do?", PASSAGES)
            identity = judge.caller.chat.identity
    assert len(seen) == 1 and srv.successes == 1
    assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]
    # The spelling changes the body, so it is part of the provider's identity (cache keys).
    with Judge(provider="llamacpp", model="m", base_url="http://127.0.0.1:9/v1") as plain:
        assert plain.caller.chat.identity != identity


def test_a_schema_the_user_gave_is_sent_as_given() -> None:
    given = json_schema_for(Scale.binary(), "listwise", shape=AnswerShape(reasons=False))
    bodies: list[dict[str, Any]] = []

    def answer(request: Recorded) -> Item:
        bodies.append(schema_of(request))
        items = [{"id": str(i), "verdict": "yes"} for i in (1, 2, 3)]
        return Answer(text=json.dumps({"verdicts": items}))

    with ScriptedServer(responder=answer) as srv:
        with Judge(
            provider="local",
            model="judge-model",
            base_url=srv.openai_base_url,
            mode="listwise",
            reasons=False,
            params=SamplingParams(response_format="json_schema", json_schema=given),
            limits=Limits(max_attempts=1, timeout_s=10.0),
        ) as judge:
            jq = judge.judge("what does a kettle do?", PASSAGES)
    assert [v.status for v in jq.verdicts] == ["ok"] * 3
    assert bodies == [given]  # no ids, no counts added to a schema the user wrote
