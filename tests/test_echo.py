"""The query-echo checks of judging/echo.py: masking the query's words, and finding the spans
that restate the query."""

from __future__ import annotations

import pytest

from judge.judging.echo import mask_query, restatements, without_restatements

QUERY = "what is the boiling point of water at sea level"  # boiling point water sea level


def spanned(text: str, query: str = QUERY) -> list[str]:
    return [text[a:b] for a, b in restatements(text, query)]


def test_the_query_said_again_in_other_words_is_a_restatement() -> None:
    text = "Everything about the boiling point of water at sea level. Museums open at nine."
    assert spanned(text) == ["boiling point of water at sea level"]
    # Three quarters of its topic words are enough, in any order, two other words apart.
    assert spanned("At sea level, the water's boiling point is what we mean") == [
        "sea level, the water's boiling point"
    ]
    # Every run is found: the query's words between sentences, over and over.
    interleaved = "Museums open at nine. boiling point water sea level. They close at five. "
    assert len(restatements(interleaved * 2, QUERY)) == 2


@pytest.mark.parametrize(
    "text",
    [
        # The topic words apart, as an answer uses them: no three-quarters run.
        "Water boils at 100 C at sea level; higher up the boiling point drops.",
        # Fewer than three quarters of the query's topic words.
        "The boiling point of milk is a little higher than you would think.",
        # More than two other words between them.
        "boiling is fun, and so is finding the point where cold water finally meets the sea "
        "at its level",
    ],
)
def test_an_answer_that_uses_the_query_s_words_apart_restates_nothing(text: str) -> None:
    assert restatements(text, QUERY) == []
    assert without_restatements(text, QUERY) is None


def test_a_restatement_is_taken_out_for_the_score_only_and_never_empties_the_text() -> None:
    text = "Boiling point of water at sea level: museums open at nine."
    assert without_restatements(text, QUERY) == ": museums open at nine."
    assert without_restatements("boiling point of water at sea level", QUERY) == "."
    # The text itself is not changed; the masked form blanks every query word instead.
    assert mask_query(text, QUERY) == "of at : museums open at nine."


def test_short_and_chinese_queries_have_no_restatements() -> None:
    # One topic word cannot be told from a passage naming its subject.
    assert restatements("Rust, Rust, Rust: the language", "rust") == []
    # Chinese restatements are the list layer's (judging/sanitise.py).
    assert restatements("水的沸点是多少？水的沸点是一百度。", "水的沸点是多少") == []


def test_the_query_said_in_bare_pieces_is_a_restatement() -> None:
    # Pairs of the query's words set apart as sentences of their own, between real sentences.
    text = "Museums open at nine. Boiling point. They close at five. Water, sea level. Free entry."
    assert spanned(text) == ["Boiling point.", "Water, sea level."]
    bare = "Museums open at nine. They close at five. Free entry."
    assert without_restatements(text, QUERY) == bare
    # Tags split by bars are pieces too.
    assert spanned("Museum hours | boiling | point | water | sea level") == [
        "boiling | point | water | sea level"
    ]


@pytest.mark.parametrize(
    "text",
    [
        # Bare pieces holding fewer than three quarters of the topic words.
        "Museums open at nine. Boiling point. They close at five. Water.",
        # Every piece carries words of its own: sentences about the topic, not the query.
        "The boiling point drops. Water boils sooner. Far above sea level the air is thin.",
    ],
)
def test_pieces_that_do_not_say_the_query_are_not_restatements(text: str) -> None:
    assert restatements(text, QUERY) == []
