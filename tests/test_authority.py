"""authority@k and low_quality@k from the [metrics.authority] tier list: the default TLD
classes, rule precedence, hand-computed values, and bad config caught before any call."""

from __future__ import annotations

from pathlib import Path

import pytest

from judge.cli.main import main
from judge.config import load_config
from judge.errors import ConfigError
from judge.metrics.authority import TierList
from judge.metrics.compute import metrics_for_queries
from judge.schema import MetricPolicy, Passage, Query, Scale, Verdict
from judge.tiers import AuthorityTiers, TierScores
from tests.servers import ScriptedServer

SOURCES = Path(__file__).resolve().parent.parent / "datasets" / "sources.jsonl"


def _tier(url: str, **rules: object) -> str | None:
    return TierList(AuthorityTiers.model_validate(rules)).tier_of(url)


def _metrics(
    names: list[str], urls: list[str | None], tiers: AuthorityTiers | None = None
) -> dict[str, float | None]:
    passages = tuple(Passage(id=f"p{i}", text=f"t{i}", url=u) for i, u in enumerate(urls))
    query = Query(query_id="q", query="x", passages=passages)
    verdicts = [
        Verdict(passage_id=p.id, rank=i + 1, status="ok", label="no", grade=0)
        for i, p in enumerate(passages)
    ]
    policy = MetricPolicy(authority=tiers or AuthorityTiers())
    (row,) = metrics_for_queries(names, [(query, verdicts)], Scale.binary(), policy)
    return row


@pytest.mark.parametrize(
    ("url", "tier"),
    [
        ("https://www.cdc.gov/flu", "government"),
        ("https://www.nhc.gov.cn/x", "government"),
        ("https://www.gov.uk/renew", "government"),
        ("https://www.army.mil", "government"),
        ("https://www.who.int/news", "government"),
        ("https://www.mit.edu/", "academic"),
        ("https://www.ox.ac.uk/", "academic"),
        ("https://www.pku.edu.cn/", "academic"),
        ("https://notgov.cn/", "unknown"),  # a suffix matches whole labels only
        ("https://example.com/", "unknown"),
        ("https://zh.wikipedia.org/wiki/x", "unknown"),  # no site rankings by default
    ],
)
def test_default_tiers_are_tld_classes_only(url: str, tier: str) -> None:
    assert _tier(url) == tier


def test_defaults_can_be_dropped() -> None:
    assert _tier("https://www.cdc.gov", defaults=False) == "unknown"
    assert _tier("https://www.cdc.gov", defaults=False, government=["cdc.gov"]) == "government"


def test_the_most_specific_rule_wins() -> None:
    rules = {
        "academic": ["example.edu"],
        "official": ["*.docs.example.edu"],  # 3 literal labels beat 2
        "low_quality": ["spam.docs.example.edu", "*.blogspot.com"],  # 4 beat 3
        "reference": ["re:wiki[0-9]+\\.example\\.edu"],  # a regex names the whole host
    }
    assert _tier("https://www.example.edu/", **rules) == "academic"
    assert _tier("https://api.docs.example.edu/", **rules) == "official"
    assert _tier("https://spam.docs.example.edu/", **rules) == "low_quality"
    assert _tier("https://a.spam.docs.example.edu/", **rules) == "low_quality"
    assert _tier("https://wiki42.example.edu/", **rules) == "reference"
    assert _tier("https://wiki42.example.edu.evil.com/", **rules) == "unknown"  # fullmatch
    assert _tier("https://me.blogspot.com/", **rules) == "low_quality"
    # Your rule beats a default of the same specificity; a more specific default still wins.
    assert _tier("https://www.mit.edu/", reference=["edu"]) == "reference"
    assert _tier("https://www.pku.edu.cn/", low_quality=["cn"]) == "academic"
    # Equally specific rules of yours that disagree: the lower score, no authority on a tie.
    tie = {"official": ["*.example.org"], "low_quality": ["news.*.org"]}
    assert _tier("https://news.example.org/", **tie) == "low_quality"


def test_hosts_and_rules_compare_normalised() -> None:
    rules = {"official": [".Example.COM.", "中国.cn"]}
    assert _tier("HTTP://WWW.EXAMPLE.COM/x", **rules) == "official"
    assert _tier("http://www.xn--fiqs8s.cn/", **rules) == "official"


def test_authority_and_low_quality_at_k_by_hand() -> None:
    tiers = AuthorityTiers(low_quality=("*.farm.example",))
    urls: list[str | None] = [
        "https://www.cdc.gov/a",  # government 0.9
        None,  # no url: an unknown source, 0.5
        "https://x.farm.example/b",  # low_quality 0.0
        "https://www.pku.edu.cn/c",  # academic 0.8
    ]
    names = ["authority@1", "authority@2", "authority@4", "authority@10", "low_quality@2"]
    names += ["low_quality@3", "low_quality@10", "authority", "low_quality"]
    assert _metrics(names, urls, tiers) == pytest.approx(
        {
            "authority@1": 0.9,
            "authority@2": 0.7,  # (0.9 + 0.5) / 2
            "authority@4": 0.55,  # 2.2 / 4
            "authority@10": 0.55,  # k > n
            "low_quality@2": 0.0,
            "low_quality@3": 1 / 3,
            "low_quality@10": 0.25,
            "authority": 0.55,
            "low_quality": 0.25,
        }
    )
    # Scores are yours to set; a partial table keeps the other defaults.
    scored = tiers.model_copy(update={"scores": TierScores(government=0.5, unknown=0.1)})
    assert _metrics(["authority@2"], urls, scored) == {"authority@2": pytest.approx(0.3)}
    # No url in the top k: undefined, not the unknown tier's score.
    assert _metrics(["authority@1", "low_quality@1"], [None, "https://cdc.gov"]) == {
        "authority@1": None,
        "low_quality@1": None,
    }
    assert _metrics(["authority@3", "low_quality@3"], []) == {
        "authority@3": None,
        "low_quality@3": None,
    }


def _config(tmp_path: Path, authority: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(
        '[judge]\nprovider = "local"\nmodel = "m"\n[metrics]\nnames = ["authority@3"]\n'
        f"[metrics.authority]\n{authority}\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("authority", "said"),
    [
        ('offical = ["python.org"]', "metrics.authority: unknown tier 'offical'; tiers: official"),
        (
            "low_quality = ['re:spam[0-9']",
            "metrics.authority.low_quality: 're:spam[0-9': bad regex",
        ),
        ('reference = ["https://en.wikipedia.org/"]', "is not a host rule"),
        ('official = ["a..b"]', "'a..b' is not a host name or suffix"),
        ('official = ["x.org"]\nreference = ["X.org"]', "rule 'X.org' is in both official and"),
        ("scores = { reference = 1.5 }", "metrics.authority.scores.reference: Input should be"),
        (
            "scores = { refrence = 0.5 }",
            "metrics.authority.scores.refrence: unknown key (did you mean 'reference'?)",
        ),
    ],
)
def test_bad_tier_config_names_the_file_and_key(tmp_path: Path, authority: str, said: str) -> None:
    path = _config(tmp_path, authority)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: ")
    assert said in str(err.value)


def test_a_bad_rule_stops_judge_run_before_any_call(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[judge]\nprovider = "local"\nmodel = "m"\n'
        f'[provider]\nbase_url = "{server.openai_base_url}"\n'
        '[metrics]\nnames = ["authority@4", "ndcg"]\n'
        "[metrics.authority]\nlow_quality = ['re:(unclosed']\n",
        encoding="utf-8",
    )
    code = main(["run", str(path), str(SOURCES), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and str(path) in err[0] and "metrics.authority.low_quality" in err[0]
    assert "Traceback" not in err[0]
    assert server.requests == []  # nothing was paid for
    assert not (tmp_path / "out" / "verdicts.jsonl").exists()
