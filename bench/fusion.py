"""Logistic fusion of relevance signals, fitted and scored with queries held out.

The model: standardise each feature (mean and standard deviation of the fitting pairs), then

    P(relevant) = 1 / (1 + exp(-(b + sum_i w_i * z_i)))

fitted by Newton's method on the log-likelihood minus ``L2 / 2 * |w|^2`` (the intercept is not
penalised). ``L2 = 10`` is fixed in advance, not tuned on these pairs: with a few hundred pairs
and correlated signals (two cosines) strong shrinkage keeps the weights from trading off noise.

Folds hold whole queries (a query's passages are never in the fold that fits them): queries
are shuffled with a fixed seed and dealt round-robin into ``folds`` folds. A fold's cut is the
one that maximises Cohen's kappa on its training pairs; kappa is then counted over all pairs'
held-out labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from judge.analysis.reliability import cohen_kappa, roc_auc

Floats = npt.NDArray[np.float64]
L2 = 10.0
SEED = 20260

# Few features per model: every combination is fitted on the same folds.
COMBOS: tuple[tuple[str, ...], ...] = (
    ("cross", "cross_sent"),
    ("cross", "minilm"),
    ("cross", "e5"),
    ("cross", "minilm", "e5"),
    ("cross", "bm25"),
    ("minilm", "e5"),
    ("minilm", "bm25"),
    ("e5", "bm25"),
    ("minilm", "e5", "bm25"),
    ("minilm", "e5", "overlap"),
    ("minilm", "ql_pmi"),
    ("e5", "ql_pmi"),
    ("minilm", "e5", "ql_pmi"),
    ("minilm", "e5", "bm25", "ql_pmi"),
    ("minilm", "e5", "bm25", "ql"),
)


@dataclass(frozen=True)
class Logistic:
    mean: Floats
    scale: Floats
    weights: Floats
    intercept: float

    def predict(self, x: Floats) -> Floats:
        z = (x - self.mean) / self.scale
        return np.asarray(1.0 / (1.0 + np.exp(-(self.intercept + z @ self.weights))))

    def as_dict(self, names: tuple[str, ...]) -> dict[str, object]:
        return {
            "intercept": round(self.intercept, 4),
            **{
                n: {"mean": round(m, 5), "sd": round(s, 5), "w": round(w, 4)}
                for n, m, s, w in zip(names, self.mean, self.scale, self.weights, strict=True)
            },
        }


def fit(x: Floats, y: npt.NDArray[np.bool_], l2: float = L2) -> Logistic:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    z = np.column_stack([np.ones(len(x)), (x - mean) / scale])
    beta = np.zeros(z.shape[1])
    penalty = np.full(z.shape[1], l2)
    penalty[0] = 0.0
    target = y.astype(np.float64)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(z @ beta)))
        grad = z.T @ (target - p) - penalty * beta
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        beta += step
        if np.abs(step).max() < 1e-9:
            break
    return Logistic(mean, scale, beta[1:], float(beta[0]))


def fit_all(x: Floats, y: npt.NDArray[np.bool_]) -> Logistic:
    return fit(x, y)


def kappa_at(scores: Floats, gold: npt.NDArray[np.bool_], cut: float) -> float | None:
    said = scores >= cut
    table = [
        [np.sum(~said & ~gold), np.sum(~said & gold)],
        [np.sum(said & ~gold), np.sum(said & gold)],
    ]
    return cohen_kappa(table)


def best_kappa(scores: Floats, gold: npt.NDArray[np.bool_]) -> tuple[float, float | None]:
    """The cut (a midpoint between adjacent distinct scores) with the highest kappa."""
    values = np.unique(scores)
    cuts = (values[1:] + values[:-1]) / 2 if len(values) > 1 else values
    best: tuple[float, float | None] = (float(cuts[0]), None)
    for cut in cuts:
        k = kappa_at(scores, gold, float(cut))
        if k is not None and (best[1] is None or k > best[1]):
            best = (float(cut), k)
    return best


@dataclass(frozen=True)
class CrossValidated:
    scores: Floats  # held-out scores, in pair order
    said: npt.NDArray[np.bool_]  # held-out labels at each fold's training cut
    auc: float | None
    kappa: float | None


def folds_of(groups: npt.NDArray[np.str_], folds: int) -> npt.NDArray[np.int64]:
    names = sorted(set(groups.tolist()))
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(names))
    fold_of = {names[j]: i % folds for i, j in enumerate(order)}
    return np.array([fold_of[g] for g in groups.tolist()])


def cross_validate(
    x: Floats,
    gold: npt.NDArray[np.bool_],
    groups: npt.NDArray[np.str_],
    folds: int,
    *,
    fitted: bool,
) -> CrossValidated:
    """Held-out scores (fitted on the other folds when ``fitted``, else the feature itself) and
    labels at the cut that is best on the other folds."""
    fold = folds_of(groups, folds)
    scores = np.zeros(len(x))
    said = np.zeros(len(x), dtype=bool)
    for k in range(folds):
        train, test = fold != k, fold == k
        if fitted:
            model = fit(x[train], gold[train])
            train_scores, scores[test] = model.predict(x[train]), model.predict(x[test])
        else:
            train_scores, scores[test] = x[train, 0], x[test, 0]
        cut, _ = best_kappa(train_scores, gold[train])
        said[test] = scores[test] >= cut
    table = [
        [np.sum(~said & ~gold), np.sum(~said & gold)],
        [np.sum(said & ~gold), np.sum(said & gold)],
    ]
    return CrossValidated(scores, said, roc_auc(scores, gold), cohen_kappa(table))
