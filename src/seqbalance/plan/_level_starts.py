"""A ``lockstep`` start for padded plans of three or more positions (``balanced``, step 4):
the positions' levels chosen first, the runs cut to fit them.

A padded plan of runs of the samples sorted longest first (``plan/_intervals.py``) dealt by
cost tier costs the sum of its levels, each tier's costliest run. The local search and
``plan/_levels.py`` move from a plan's own cuts and tiers, so where the best plan spreads the
longest samples over every position (each alone, the positions' levels close together), a plan
that put them in one tier stays there. Here the levels come first: whether runs fit ``levels``
(at most ``dp`` runs per position, each within its position's level and ``take``) is a reach
program over how many runs each position has used (the farthest sample reached, taking each
run as long as its level allows; ``(dp + 1) ** M`` states, every level vector of a batch at
once). Level vectors along a few shapes (the costliest sample of each tier of the order, that
of the first samples, straight lines) are scaled from the count's bound up to the plan's own
levels, the least scale that fits found by sections; the runs of the least fitting vector are
cut out of the program, a position short of runs splitting its own (so it keeps within its
level), and dealt by tier.

``descended_cuts`` (``_at_count.lowered``'s last pass, on the chosen plan's runs) descends from
that plan's own levels the same way: each move lowers one level by a few percent and raises
the others together by the least fraction of what would break even that still fits (one batch
of vectors a move), while the sum falls. The chosen plans are local minima of moves of a cut
or two, yet their levels are not: on ``batch_rebalance``'s bundled GA 4 steps the descent finds
plans up to a few percent cheaper (the longest samples spread alone over more positions, every
level nearer the others' runs), moves no cut search makes.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from seqbalance.plan._cut_pairs import lockstep_values, move_cut_pairs
from seqbalance.plan._intervals import Intervals
from seqbalance.plan._level_bound import LEVEL_STATES, LevelReach
from seqbalance.plan._padded_search import dealt_by_tier
from seqbalance.plan._shared import Microbatches

__all__ = ["LEVEL_STATES", "descended_cuts", "level_start"]

_SECTIONS = 12
"""Scales tried at once per shape and round ..."""
_ROUNDS = 2
"""... and rounds (each narrows the scale 13 times)."""
_DROPS = (0.02, 0.06)
"""``descended_cuts``: how far (fractions) a move lowers one level ..."""
_RAISES = 5
"""... the others' common raises tried per drop (fractions of the break-even raise, 0
included) ..."""
_MOVES = 6
"""... and the moves applied at most (each one batch of ``m x 2 x 5`` level vectors)."""
_RELATIVE = 1e-12  # gains smaller than this are float noise


class Problem(Protocol):
    """What the start reads of a ``plan._problem.Problem`` (structural)."""

    sample_costs: np.ndarray
    overhead: float
    dp: int
    allow_empty: bool


def level_start(
    p: Problem, intervals: Intervals, m: int, low: float, high: float
) -> Microbatches | None:
    """A plan of ``m`` runs per rank of ``intervals.order`` dealt by tier whose levels (no
    overhead) sum to at most ``high`` (where no sample costs more than a longer one: a run a
    position splits may exceed its level otherwise), searched from ``low`` (a lower bound on
    that sum); None where the reach program would exceed ``LEVEL_STATES`` states or no shape
    fits within ``high``."""
    if p.dp < 2 or m < 3 or (p.dp + 1) ** m > LEVEL_STATES or intervals.n == 0:
        return None
    costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
    shapes = _shapes(costs, p.dp, m)
    if shapes.size == 0 or not low < high:
        return None
    reach = LevelReach(costs, intervals.take, p.dp, m)
    fits = reach.fits(shapes * high)
    shapes = shapes[fits]
    if shapes.shape[0] == 0:
        return None
    below, above = np.full(shapes.shape[0], max(low, 0.0)), np.full(shapes.shape[0], high)
    fractions = np.arange(1, _SECTIONS + 1) / (_SECTIONS + 1)
    rows = np.arange(shapes.shape[0])
    for _ in range(_ROUNDS):
        scales = below[:, None] + (above - below)[:, None] * fractions
        fit = reach.fits((shapes[:, None, :] * scales[:, :, None]).reshape(-1, m))
        fit = fit.reshape(shapes.shape[0], _SECTIONS)
        first = np.where(fit.any(axis=1), fit.argmax(axis=1), _SECTIONS)
        above = np.where(first < _SECTIONS, scales[rows, np.minimum(first, _SECTIONS - 1)], above)
        below = np.where(first > 0, scales[rows, np.maximum(first - 1, 0)], below)
    best = int(np.argmin(above))
    runs = reach.runs(shapes[best] * above[best])
    return _dealt(p, intervals, costs, runs, m)


def descended_cuts(
    least: np.ndarray, take: np.ndarray, cuts: np.ndarray, dp: int
) -> np.ndarray | None:
    """Cut points (ascending, ``k + 1``, non-empty runs within ``take``) of ``k = dp x m``
    runs cheaper in ``lockstep`` than ``cuts`` (least costs ``least``, longest first): the
    levels of ``cuts`` descended (module docstring; ``m >= 3`` and at most ``LEVEL_STATES``
    states), then two cuts moved at once (``plan/_cut_pairs.py``); None where neither lowers
    it."""
    cuts = np.asarray(cuts, dtype=np.int64)
    m = (cuts.size - 1) // dp
    found = None
    if dp > 1 and m >= 3 and (dp + 1) ** m <= LEVEL_STATES and cuts.size - 1 == dp * m:
        found = _descended(least, take, cuts, dp, m)
    # Two cuts moved from both: from the descended levels they can end at a local minimum
    # dearer than from the cuts given (1 of 90 bundled steps: hh_rlhf 6, +0.34%).
    starts = [cuts] if found is None else [cuts, found]
    tried = [move_cut_pairs(least, take, start, dp) for start in starts] + [found]
    tried = [t for t in tried if t is not None]
    if not tried:
        return None
    return min(tried, key=lambda t: lockstep_values(least, t[None, :], dp)[0])


def _descended(
    least: np.ndarray, take: np.ndarray, cuts: np.ndarray, dp: int, m: int
) -> np.ndarray | None:
    """``cuts`` with its levels descended (``descended_cuts``), or None where no move lowers
    their sum or the runs of the lowest cannot be split into ``dp x m``."""
    costs = np.diff(cuts) * least[cuts[:-1]]
    start = -np.sort(-costs)[::dp][:m]
    levels, reach = start, LevelReach(least, take, dp, m)
    fractions = np.arange(_RAISES) / _RAISES
    drops = np.asarray(_DROPS)
    for _ in range(_MOVES):
        # Vector (t, d, f): level t lowered by drops[d], the others raised by fractions[f] of
        # the raise that would leave the sum unchanged.
        others = levels.sum() - levels
        lowered = levels[:, None] * (1 - drops[None, :])
        # Where the others sum to 0 (costs of 0), or to less than the least normal float (the
        # inverse of a subnormal overflows: numpy's warning, then inf x 0), they are not
        # raised: the drop alone is tried.
        share = np.divide(1.0, others, out=np.zeros(m), where=others >= np.finfo(float).tiny)
        raise_by = (levels[:, None] - lowered)[:, :, None] * share[:, None, None] * fractions
        trial = np.broadcast_to(levels, (m, drops.size, _RAISES, m)) * (1 + raise_by[..., None])
        trial = trial.copy()
        trial[np.arange(m), :, :, np.arange(m)] = lowered[:, :, None]
        trial = trial.reshape(-1, m)
        sums = np.where(reach.fits(trial), trial.sum(axis=1), np.inf)
        best = int(np.argmin(sums))
        if not sums[best] < levels.sum() * (1 - _RELATIVE):
            break
        levels = -np.sort(-trial[best])
    if levels is start:
        return None
    split = _split_cuts(reach.runs(levels), dp, m)
    if len(split) != dp * m + 1:
        return None
    found = np.asarray(split, dtype=np.int64)
    if not lockstep_values(least, found[None, :], dp)[0] < (
        lockstep_values(least, cuts[None, :], dp)[0] * (1 - _RELATIVE)
    ):
        return None
    return found


def _split_cuts(runs: list[tuple[int, int, int]], dp: int, m: int) -> list[int]:
    """The cut points (ascending) of ``runs`` (start, end, position) after each position short
    of ``dp`` runs splits its largest (each half within its level, costs not rising with the
    order) until it has them or all its runs hold one sample."""
    cuts: list[int] = [0]
    for t in range(m):
        own = [(start, end) for start, end, position in runs if position == t]
        while len(own) < dp and own and max(end - start for start, end in own) > 1:
            j = max(range(len(own)), key=lambda i: (own[i][1] - own[i][0], -own[i][0]))
            start, end = own.pop(j)
            own += [(start, (start + end) // 2), ((start + end) // 2, end)]
        cuts += [end for _, end in own]
    return sorted(cuts)


def _shapes(costs: np.ndarray, dp: int, m: int) -> np.ndarray:
    """float64 ``[shapes, m]``: level vectors summing to 1, non-increasing (the costliest
    sample of each tier of ``dp`` runs if each held one, those of the first samples raised to
    1.5, two straight lines), each positive."""
    n = costs.size
    tiers = costs[np.minimum(np.arange(m) * dp, n - 1)]
    with np.errstate(over="ignore"):  # costs past about 1e205: an infinite shape, left out below
        firsts = costs[np.minimum(np.arange(m), n - 1)] ** 1.5
    shapes = np.stack([tiers, firsts, np.linspace(1, 0.5, m), np.linspace(1, 0.3, m)])
    total = shapes.sum(axis=1, keepdims=True)
    usable = (np.isfinite(total[:, 0]) & (total[:, 0] > 0)) & (shapes > 0).all(axis=1)
    return shapes[usable] / total[usable]


def _dealt(
    p: Problem,
    intervals: Intervals,
    costs: np.ndarray,
    runs: list[tuple[int, int, int]],
    m: int,
) -> Microbatches | None:
    """The runs, each position's split (largest first) until it has ``dp`` (or cannot),
    dealt by tier; None where fewer than ``dp x m`` runs are made and micro-batches may not
    be empty."""
    cuts = _split_cuts(runs, p.dp, m)
    short = p.dp * m - (len(cuts) - 1)
    if short > 0 and not p.allow_empty:
        return None
    cuts = np.asarray(cuts + [cuts[-1]] * short, dtype=np.int64)
    first = np.minimum(cuts[:-1], costs.size - 1)
    weights = p.overhead + np.diff(cuts) * costs[first]
    return dealt_by_tier(intervals.order, cuts, weights, p.dp)
