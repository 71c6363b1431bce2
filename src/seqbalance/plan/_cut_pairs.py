"""Moving two cuts of a padded ``lockstep`` plan's runs at once (``_at_count.lowered``'s last
pass).

A padded plan of runs of the order longest first is its cut points; in ``lockstep``, dealt by
cost tier, it costs the sum of every ``dp``-th run cost sorted costliest first
(``plan/_padded_search.py``). That search moves one cut at a time; where the chosen plan is a
local minimum of those moves, moving two nearby cuts together (a run shrinks at one end while
its neighbour grows at the other, three runs changing at once) still lowers it on about a
third of ``batch_rebalance``'s bundled GA 4 steps (by up to 1.25%): each such pair is
priced at once (every candidate's runs sorted in one numpy call) and the best applied, until
none helps or ``_ROUNDS`` have passed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lockstep_values", "move_cut_pairs"]

_SHIFTS = np.array([-3, -2, -1, 0, 1, 2, 3])
"""How far (samples) each cut of a pair moves."""
_SPAN = 2
"""The second cut of a pair is at most this many cuts after the first."""
_ROUNDS = 12
"""Best moves applied at most."""
_CANDIDATES = 4_000_000
"""The pass is skipped where candidates x runs (elements sorted per round) exceed this."""
_RELATIVE = 1e-12  # improvements smaller than this are float noise


def move_cut_pairs(
    least: np.ndarray, take: np.ndarray, cuts: np.ndarray, dp: int
) -> np.ndarray | None:
    """Cut points (``k + 1`` ascending, non-empty runs within ``take``) cheaper than ``cuts``
    in ``lockstep`` with least costs ``least`` (longest first), or None where no pair of
    moves lowers it (or the pass would be too dear)."""
    cuts = np.asarray(cuts, dtype=np.int64)
    k = cuts.size - 1
    first, second, d1, d2 = _moves(k)
    if first.size * k > _CANDIDATES or first.size == 0:
        return None
    value, moved = lockstep_values(least, cuts[None, :], dp)[0], False
    rows = np.arange(first.size)
    for _ in range(_ROUNDS):
        trial = np.repeat(cuts[None, :], first.size, axis=0)
        trial[rows, first] += d1
        trial[rows, second] += d2
        sizes = np.diff(trial, axis=1)
        starts = np.clip(trial[:, :-1], 0, least.size - 1)
        fits = ((sizes >= 1) & (sizes <= take[starts])).all(axis=1)
        if not fits.any():
            break
        values = np.where(fits, lockstep_values(least, trial, dp), np.inf)
        best = int(np.argmin(values))
        if not values[best] < value * (1 - _RELATIVE):
            break
        cuts, value, moved = trial[best], float(values[best]), True
    return cuts if moved else None


def _moves(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of inner cuts (``first <= second <= first + _SPAN``; a cut alone where they
    are the same) and their shifts, each move once."""
    pairs = [(a, b) for a in range(1, k) for b in range(a, min(k - 1, a + _SPAN) + 1)]
    if not pairs:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    a, b = np.array(pairs, dtype=np.int64).T
    s1, s2 = np.meshgrid(_SHIFTS, _SHIFTS, indexing="ij")
    s1, s2 = s1.ravel(), s2.ravel()
    first, second = np.repeat(a, s1.size), np.repeat(b, s1.size)
    d1, d2 = np.tile(s1, a.size), np.tile(s2, a.size)
    alone = first == second
    keep = np.where(alone, (d2 == 0) & (d1 != 0), (d1 != 0) & (d2 != 0))
    return first[keep], second[keep], d1[keep], d2[keep]


def lockstep_values(least: np.ndarray, cuts: np.ndarray, dp: int) -> np.ndarray:
    """Per row of cut points: the ``lockstep`` cost of its runs dealt by cost tier (runs
    outside the samples priced by a clipped start; the caller masks those rows)."""
    starts = np.clip(cuts[:, :-1], 0, least.size - 1)
    costs = np.diff(cuts, axis=1) * least[starts]
    return -np.sort(-costs, axis=1)[:, ::dp].sum(axis=1)
