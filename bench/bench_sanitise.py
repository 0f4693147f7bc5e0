"""What judging/sanitise.py takes out of passages: nothing from clean ones, the attack from
attacked ones.

Over a labelled pairs file (rows ``{query, text, label}``):

- clean: how many passages lose any text (each one is printed with what it lost);
- attacked: every label-0 passage under every phrasing of each attack kind (bench/injections.py,
  or ``--attacks FILE``: a module defining ``ATTACKS`` in the same shape, such as a held-out set
  written without sight of the sanitiser), and how many come back to their clean text, give or
  take ``--slack`` words.

No judge is called: this measures the text a judge would see. ``bench/bench_quality.py
--injection`` measures what that does to the verdicts.

    python bench/bench_sanitise.py ../shared/data/trec-dl-2019-sample.jsonl [--attacks FILE]
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from string import Template

from injections import ATTACKS, _interleave, load_attacks

from judge.judging.sanitise import strip_aimed


def restored(
    rows: Sequence[dict[str, str]], attacks: Mapping[str, Sequence[str]], slack: int
) -> dict[str, tuple[int, int, list[str]]]:
    """Per attack kind: passages restored, passages attacked, and one leftover per phrasing
    that was not always removed."""
    out: dict[str, tuple[int, int, list[str]]] = {}
    for kind, templates in attacks.items():
        ok = total = 0
        left: dict[int, str] = {}
        for row in rows:
            words = re.findall(r"\w+", row["query"].lower())
            clean, _ = strip_aimed(row["text"], row["query"])
            for i, template in enumerate(templates):
                attacked = Template(template).safe_substitute(
                    text=row["text"],
                    query=row["query"],
                    label="yes",
                    words=" ".join(words),
                    interleaved=_interleave(row["text"], words),
                )
                got, _ = strip_aimed(attacked, row["query"])
                total += 1
                kept = set(re.findall(r"\w+", clean.casefold()))
                extra = [w for w in re.findall(r"\w+", got.casefold()) if w not in kept]
                if len(extra) <= slack:
                    ok += 1
                else:
                    left.setdefault(i, " ".join(extra)[:160])
        out[kind] = (ok, total, [f"phrasing {i}: {text}" for i, text in sorted(left.items())])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pairs")
    parser.add_argument("--attacks", help="a module defining ATTACKS (default: ours)")
    parser.add_argument("--slack", type=int, default=3, help="words left over still counted")
    args = parser.parse_args()
    with open(args.pairs, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    changed = 0
    for row in rows:
        _, removed = strip_aimed(row["text"], row["query"])
        if removed:
            changed += 1
            print(f"  clean passage changed ({row['query']!r}, label {row['label']}): {removed}")
    print(f"clean passages changed: {changed} of {len(rows)}")
    attacks = load_attacks(args.attacks) if args.attacks else ATTACKS
    zero = [r for r in rows if int(r["label"]) == 0]
    name = args.attacks or "bench/injections.py"
    for kind, (ok, total, left) in restored(zero, attacks, args.slack).items():
        print(f"{name} {kind}: {ok} of {total} attacked passages restored ({ok / total:.0%})")
        for line in left:
            print(f"    left over, {line}")


if __name__ == "__main__":
    main()
