"""near_dup@k and sites@k: normalisation, shingles, Jaccard and the rate, hand-computed;
Chinese near-duplicates; sites from the bundled Public Suffix List, offline."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from judge.metrics.compute import metrics_for_queries, parse_metric_name
from judge.metrics.facts import lower_is_better
from judge.metrics.hosts import host_of, site_of
from judge.metrics.redundancy import NEAR_DUP_JACCARD, jaccard, near_duplicates, shingles, tokens
from judge.schema import MetricPolicy, Passage, Query, Scale, Verdict


def _metrics(
    names: list[str], texts: list[str], urls: list[str | None] | None = None
) -> dict[str, float | None]:
    """One query's metrics through the same entry point a run uses."""
    urls = urls or [None] * len(texts)
    passages = tuple(
        Passage(id=f"p{i}", text=t, url=u) for i, (t, u) in enumerate(zip(texts, urls, strict=True))
    )
    query = Query(query_id="q", query="x", passages=passages)
    verdicts = [
        Verdict(passage_id=p.id, rank=i + 1, status="ok", label="yes", grade=1)
        for i, p in enumerate(passages)
    ]
    (row,) = metrics_for_queries(names, [(query, verdicts)], Scale.binary(), MetricPolicy())
    return row


def test_normalisation_folds_width_case_and_punctuation_and_splits_chinese_by_character() -> None:
    assert tokens("ＨＥＬＬＯ,  World!! snake_case") == ["hello", "world", "snake", "case"]
    assert tokens("小狗贫血，怎么办？") == ["小", "狗", "贫", "血", "怎", "么", "办"]
    assert tokens("Python 3 教程") == ["python", "3", "教", "程"]
    assert tokens(" ，。!?") == []


def test_shingles_and_jaccard_by_hand() -> None:
    assert shingles("a b c d") == {"a\x1fb\x1fc", "b\x1fc\x1fd"}  # tokens joined by U+001F
    assert shingles("A, b!") == {"a\x1fb"}  # fewer tokens than a shingle: one, all of them
    assert shingles("小狗贫血") == {"小\x1f狗\x1f贫", "狗\x1f贫\x1f血"}
    assert shingles("...") == frozenset()
    # {abc, bcd} vs {abc, bce}: 1 shared of 3
    assert jaccard(shingles("a b c d"), shingles("a b c e")) == pytest.approx(1 / 3)
    assert jaccard(frozenset(), frozenset()) == 0.0  # two empty texts duplicate nothing


def test_the_threshold_is_inclusive() -> None:
    # 4 shingles each, 3 shared: 3 / 5 = 0.6, exactly the threshold.
    a, b = "a b c d e f", "a b c d e g"
    assert jaccard(shingles(a), shingles(b)) == NEAR_DUP_JACCARD == 0.6
    assert near_duplicates([a, b]) == [False, True]
    # {abc, bcd, cde, def} vs {abc, bcd, cdx, dxf}: 2 / 6, not a duplicate.
    assert jaccard(shingles(a), shingles("a b c d x f")) == pytest.approx(1 / 3)
    assert near_duplicates([a, "a b c d x f"]) == [False, False]


def test_near_dup_at_k_by_hand() -> None:
    a = "the quick brown fox jumps over the lazy dog"
    names = ["near_dup@1", "near_dup@2", "near_dup@3", "near_dup@4", "near_dup@10", "near_dup"]
    # ranks: a, copy of a (punctuation and case only), distinct, copy of the copy
    texts = [a, "The quick, brown fox jumps over the lazy dog!", "an unrelated passage", a]
    assert _metrics(names, texts) == {
        "near_dup@1": 0.0,
        "near_dup@2": 0.5,  # rank 2 repeats rank 1
        "near_dup@3": pytest.approx(1 / 3),
        "near_dup@4": 0.5,
        "near_dup@10": 0.5,  # k > n: m = n = 4
        "near_dup": 0.5,
    }
    assert _metrics(["near_dup@5"], ["one passage"]) == {"near_dup@5": 0.0}
    assert _metrics(["near_dup@5"], []) == {"near_dup@5": None}  # undefined, not 0
    assert _metrics(["near_dup@3"], ["", " ", "…"]) == {"near_dup@3": 0.0}  # nothing to repeat
    assert _metrics(["near_dup@3"], [a, a, a]) == {"near_dup@3": pytest.approx(2 / 3)}


def test_chinese_near_duplicates_by_character() -> None:
    # 小狗贫 狗贫血 vs 小狗贫 狗贫血 贫血了: 2 / 3 >= 0.6
    assert jaccard(shingles("小狗贫血"), shingles("小狗贫血了")) == pytest.approx(2 / 3)
    original = "小狗贫血时牙龈和眼结膜颜色变淡甚至发白，精神沉郁、容易疲劳，呼吸和心跳加快。"
    # Other punctuation and one character changed (淡 -> 浅): 34 tokens, 32 shingles each,
    # the 3 that hold the change differ: 29 / 35.
    reposted = "小狗贫血时，牙龈和眼结膜颜色变浅甚至发白!精神沉郁容易疲劳，呼吸和心跳加快!!"
    assert jaccard(shingles(original), shingles(reposted)) == pytest.approx(29 / 35)
    same_topic = "小狗贫血多数由寄生虫引起，例如钩虫、跳蚤大量吸血，或者巴贝斯虫破坏红细胞。"
    assert near_duplicates([original, reposted, same_topic]) == [False, True, False]
    assert _metrics(["near_dup@3"], [original, same_topic, reposted]) == {
        "near_dup@3": pytest.approx(1 / 3)
    }


def test_hosts_and_sites() -> None:
    assert host_of("HTTPS://WWW.Example.COM:8080/a?b#c") == "www.example.com"
    assert host_of("example.com/page") == "example.com"  # no scheme
    assert host_of("http://xn--fiqs8s.cn/") == "中国.cn"  # punycode decoded
    for nothing in (None, "", "   ", "mailto:a@b.c", "file:///etc/hosts", "http://[::1"):
        assert host_of(nothing) is None
    # A scheme without an authority names no website (they had been the sites "javascript",
    # "data" and "tel"); a host's port is not such a scheme.
    for nothing in ("javascript:alert(7)", "data:text/html,<b>x</b>", "tel:+15551234"):
        assert host_of(nothing) is None, nothing
    assert host_of("localhost:8080/x") == "localhost"
    assert site_of("https://news.bbc.co.uk/x") == site_of("http://www.bbc.co.uk") == "bbc.co.uk"
    assert site_of("https://alice.github.io") != site_of("https://bob.github.io")  # private
    assert site_of("https://www.gov.cn/zhengce") == site_of("gov.cn") == "gov.cn"
    assert site_of("https://beijing.gov.cn") == "beijing.gov.cn"
    assert site_of("http://127.0.0.1:8000/x") == "127.0.0.1"
    assert site_of("http://localhost/x") == "localhost"


def test_sites_at_k_by_hand() -> None:
    urls: list[str | None] = [
        "https://www.bbc.co.uk/news/1",
        "https://news.bbc.co.uk/2",  # the same site
        None,  # adds no site
        "https://alice.github.io/post",
        "https://bob.github.io/post",
    ]
    names = ["sites@1", "sites@2", "sites@3", "sites@4", "sites@9", "sites"]
    got = _metrics(names, [f"text {i}" for i in range(5)], urls)
    assert got == {
        "sites@1": 1.0,
        "sites@2": 1.0,
        "sites@3": 1.0,
        "sites@4": 2.0,
        "sites@9": 3.0,
        "sites": 3.0,
    }
    assert _metrics(["sites@3"], ["a", "b"], [None, None]) == {"sites@3": None}
    assert _metrics(["sites@3"], ["a", "b"], [None, "https://x.example"]) == {"sites@3": 1.0}


def test_names_parse_and_direction() -> None:
    assert parse_metric_name("near_dup@10") == ("near_dup", 10)
    assert parse_metric_name("sites") == ("sites", None)
    assert lower_is_better("near_dup@10") and not lower_is_better("sites@10")
    assert not lower_is_better("ndcg@10") and not lower_is_better("pooled_ndcg")


def test_sites_need_no_network() -> None:
    """The suffix list is the one the package ships: with every socket refused, it still
    answers (a fetch would fail)."""
    script = textwrap.dedent(
        """
        import socket

        def refuse(*args, **kwargs):
            raise OSError("network used")

        socket.socket = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from judge.metrics.hosts import site_of
        print(site_of("https://news.bbc.co.uk/x"), site_of("https://a.b.github.io"))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["bbc.co.uk", "b.github.io"]
