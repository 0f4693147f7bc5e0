"""Whatever arrives, judge answers with a verdict or its own error — never a crash.

Property tests: arbitrary judge answers only ever parse onto the scale or raise ParseError;
arbitrary dataset bytes only ever read or raise InputError naming the file.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from judge.data.datasets import read_queries
from judge.errors import InputError, ParseError
from judge.judging.verdicts import parse_listwise, parse_pointwise
from judge.providers.base import Completion
from judge.schema import Scale

SCALES = (Scale.binary(), Scale.graded())
LABELS = ["yes", "no", "Yes.", "是", "不相关", "answers", "partial", "3", "maybe", ""]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(LABELS),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["verdict", "reason", "id", "verdicts", "label", "grade", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
answers = st.one_of(
    st.text(max_size=200),
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False)),
    json_values.map(lambda v: "Sure!\n```json\n" + json.dumps(v)[:60] + "\n```"),
)


@settings(max_examples=300, deadline=None)
@given(text=answers, which=st.integers(0, 1))
def test_any_pointwise_answer_parses_onto_the_scale_or_raises_parse_error(
    text: str, which: int
) -> None:
    scale = SCALES[which]
    try:
        parsed = parse_pointwise(Completion(text=text), scale)
    except ParseError as exc:
        assert str(exc)  # the message is what the re-ask carries
        return
    assert parsed.label in scale.names
    assert parsed.grade == scale.snap(parsed.label).grade  # type: ignore[union-attr]


@settings(max_examples=200, deadline=None)
@given(text=answers, which=st.integers(0, 1))
def test_any_listwise_answer_keeps_to_the_asked_ids(text: str, which: int) -> None:
    scale, ids = SCALES[which], ["1", "2", "3"]
    try:
        parsed = parse_listwise(Completion(text=text), scale, ids)
    except ParseError:
        return
    assert set(parsed.verdicts) <= set(ids)
    assert set(parsed.missing) <= set(ids)
    assert all(v.label in scale.names for v in parsed.verdicts.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(
        st.one_of(st.binary(max_size=60), json_values.map(lambda v: json.dumps(v).encode())),
        max_size=5,
    )
)
def test_any_dataset_bytes_read_or_raise_input_error(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.jsonl"
        path.write_bytes(b"\n".join(lines))
        try:
            report = read_queries(path)
        except InputError as exc:
            assert str(path) in str(exc)
            return
        assert all(q.query for q in report.queries)
