"""Which samples make up each optimizer step of an epoch, computed one step at a time.

``EpochLayout`` is the one definition of an epoch's order that ``plan_epoch`` (eager) and the
samplers (lazy, step by step) share, so a lazily planned step holds exactly the samples the eager
plan gives it. Its per-epoch state is constant without groups: the shuffle is a keyed
pseudo-random permutation (``Permutation``) evaluated at the positions a step needs, never a
stored array; with groups it is the groups' members (``uint32`` while ``n < 2**32``) and one
start per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from seqbalance.plan._shared import unit_numbers

__all__ = ["EpochLayout", "Permutation"]

_ROUNDS = 6
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))  # splitmix64's finaliser
_CHUNK = 1 << 22  # samples per chunk when a pass over all samples is needed
_SUM_CHUNK = 1 << 19  # rows per chunk of ``step_sums`` (several int64 columns each)
_UNIT_BLOCK = 1 << 16  # units permuted at once when steps of groups are laid out one by one


class Permutation:
    """A keyed bijection of ``[0, n)`` in constant memory (a balanced Feistel network on the
    smallest even number of bits covering ``n``, cycle-walking back into range).

    The same ``(n, key)`` gives the same permutation on every machine: it is integer arithmetic
    on ``uint64`` only.
    """

    def __init__(self, n: int, key: tuple[int, ...]) -> None:
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._keys = np.random.default_rng(key).integers(0, 2**63, _ROUNDS, dtype=np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._keys:
            left, right = right, left ^ (_round(right, key) & self._mask)
        return (left << self._half) | right

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._keys[::-1]:  # each round undone, last first
            left, right = right ^ (_round(left, key) & self._mask), left
        return (left << self._half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The permuted values at ``positions`` (int64 array in ``[0, n)``), as int64."""
        return self._walk(self._encrypt, positions)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """The positions (int64) whose permuted values are ``values`` (int64 in ``[0, n)``)."""
        return self._walk(self._decrypt, values)

    def _walk(self, cipher: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
        out = cipher(np.asarray(x, dtype=np.uint64))
        outside = np.flatnonzero(out >= np.uint64(self.n))
        while outside.size:  # a bijection: walking its cycle from x < n comes back below n
            out[outside] = cipher(out[outside])
            outside = outside[out[outside] >= np.uint64(self.n)]
        return out.astype(np.int64)


def _round(half: np.ndarray, key: np.uint64) -> np.ndarray:
    """The Feistel round function: ``half ^ key`` through splitmix64's finaliser, every output
    bit a function of every input bit. The low bits of one product alone (``(half ^ key) *
    odd``, kept by the mask) are affine over GF(2) in the low input bits: on the 3-bit halves
    of 20 samples the network was a XOR with a constant, the epoch left in dataset order for a
    quarter of the seeds and most aligned blocks of four kept together."""
    mixed = half ^ key
    mixed = (mixed ^ (mixed >> np.uint64(30))) * _MIX[0]
    mixed = (mixed ^ (mixed >> np.uint64(27))) * _MIX[1]
    return mixed ^ (mixed >> np.uint64(31))


class EpochLayout:
    """The dataset indices of every optimizer step of one epoch (``plan_epoch``'s order).

    Order: the units (samples, or whole groups in order of first appearance) are permuted by
    ``Permutation(units, (seed, epoch))`` with ``shuffle``, else kept in dataset order.
    Consecutive units fill steps of ``global_batch_size`` samples (a step takes whole groups while
    they fit). ``bucket_window=w`` deals the units of each run of ``w`` steps by length
    (``plan_epoch``); each step's samples are then shuffled with
    ``np.random.default_rng((seed, epoch, window))``. With ``drop_last`` a last step short of
    ``global_batch_size`` is dropped (``dropped``).

    Args:
        lengths: 1-D integer array (a memory map is read, never copied whole).
        global_batch_size, seed, epoch, shuffle, drop_last, bucket_window: checked values.
        group_ids: int64 group id per sample, or None.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        global_batch_size: int,
        *,
        group_ids: np.ndarray | None,
        seed: int,
        epoch: int,
        shuffle: bool,
        drop_last: bool,
        bucket_window: int | None,
    ) -> None:
        self.lengths = lengths
        self.size = global_batch_size
        self.seed, self.epoch = seed, epoch
        self.window = bucket_window
        self.group_ids = group_ids
        n = int(lengths.shape[0])
        self._members: np.ndarray | None = None
        if group_ids is None:
            self._n_units = n
            self._unit_starts = None
        else:
            self._members, self._unit_starts = _group_members(group_ids)
            self._n_units = self._unit_starts.size - 1
        self._permutation = (
            Permutation(self._n_units, (seed, epoch)) if shuffle and self._n_units else None
        )
        if group_ids is None:
            total = -(-n // self.size)
            self._step_starts = None
        else:
            self._step_starts = self._fill_steps()
            total = self._step_starts.size - 1
        self._total = total
        self._window_cache: tuple[int, list[np.ndarray]] | None = None
        self._unit_block: tuple[int, np.ndarray] | None = None  # (first position, unit ids)
        self._smallest: tuple[int, int] | None = None  # smallest_step() with groups, once
        self.dropped = np.empty(0, dtype=np.int64)
        if drop_last and total and self._raw_step(total - 1).size < self.size:
            self.dropped = np.sort(self._step(total - 1))
            total -= 1
        self.n_steps = total

    def smallest_step(self) -> tuple[int, int] | None:
        """``(step, samples)`` of the first step with the fewest samples (bucketing keeps every
        step's size), or None without steps."""
        if self.n_steps == 0:
            return None
        if self._step_starts is None:  # every step full but maybe the last
            last = self.n_steps - 1
            samples = min(self.size, self._n_units - last * self.size)
            return (last, samples) if samples < self.size else (0, self.size)
        if self._smallest is None:
            sizes = np.diff(self._unit_starts)  # type: ignore[arg-type]
            ends = np.zeros(self._n_units + 1, dtype=np.int64)
            for a in range(0, self._n_units, _CHUNK):  # units in step order, chunk by chunk
                stop = min(a + _CHUNK, self._n_units)
                ends[a + 1 : stop + 1] = ends[a] + np.cumsum(sizes[self._units(a, stop)])
            steps = np.diff(ends[self._step_starts[: self.n_steps + 1]])  # type: ignore[index]
            step = int(np.argmin(steps))
            self._smallest = (step, int(steps[step]))
        return self._smallest

    def step_sums(self, values: Callable[[Any], np.ndarray]) -> np.ndarray:
        """int64 ``[n_steps, f]``: the sum over each step's samples of ``values(key)`` (an int64
        ``[k, f]`` row per sample of ``key``: int64 dataset indices, or a slice of them), in
        one vectorised pass, chunk by chunk (no step is laid out one by one): without groups
        the samples in dataset order, each to its step by the inverse shuffle (a lengths file
        is read sequentially); with groups the groups' sums in the shuffled order. With
        ``bucket_window`` these are the steps before bucketing: bucketing deals the units of a
        window among its steps, so the sums over a window are the same."""
        if self._step_starts is None:  # units are samples, ``size`` to a step: read in
            return self._sample_step_sums(values)  # dataset order (a file: sequential reads)
        per_unit = self.unit_sums(values)
        blocks = (
            per_unit[self._units(a, min(a + _SUM_CHUNK, self._n_units))]
            for a in range(0, self._n_units, _SUM_CHUNK)
        )
        return _sums_between(blocks, self._step_starts[: self.n_steps + 1])  # type: ignore[index]

    def dealt_step_sums(self, values: Callable[[Any], np.ndarray]) -> np.ndarray:
        """:meth:`step_sums` of the steps as ``bucket_window`` deals them (without groups):
        each step's sums over the samples :meth:`step` gives it, not over a whole window.

        In a full window (``window`` steps of ``size`` samples) no step fills before the last
        sample is dealt, so :meth:`_bucket`'s snake order puts the ``i``-th longest sample
        (ties in position order) in step ``snake[i % (2 * window)]``: done here for whole
        windows at once, chunk by chunk (a window's samples read together). The last window
        (a partial step, the dropped one dealt with it, or fewer steps) is dealt by
        :meth:`_bucket` itself."""
        if self.window is None or self._step_starts is not None:
            raise ValueError("dealt_step_sums needs bucket_window and no group_ids")
        width = self.window * self.size  # samples of a full window
        full = self._n_units // width
        snake = np.array([*range(self.window), *range(self.window - 1, -1, -1)], dtype=np.int64)
        per_chunk = max(1, _SUM_CHUNK // width)
        sums: np.ndarray | None = None
        for a in range(0, full, per_chunk):
            b = min(a + per_chunk, full)
            samples = self._units(a * width, b * width)
            rows = values(samples)
            weight = np.asarray(self.lengths[samples], dtype=np.int64).reshape(b - a, width)
            # Per window (a row: the chunk holds whole windows), the longest first; stable:
            # ties keep their position order. A sort per row, not one over the chunk's
            # (window, weight) pairs: 0.77 s of a 4M-sample sampler's construction.
            order = np.argsort(-weight, axis=1, kind="stable")
            first_step = np.arange(a, b, dtype=np.int64)[:, None] * self.window
            steps = np.empty((b - a, width), dtype=np.int64)
            dealt = first_step + snake[np.arange(width) % snake.size]  # the i-th longest's step
            np.put_along_axis(steps, order, dealt, axis=1)
            sums = _add_rows(sums, steps.ravel(), rows, self.n_steps)
        for number, indices, _ in self.dealt_steps(full):
            row = values(indices).sum(axis=0)
            if sums is None:
                sums = np.zeros((self.n_steps, row.size), dtype=np.int64)
            sums[number] += row
        return np.zeros((self.n_steps, 0), dtype=np.int64) if sums is None else sums

    def dealt_steps(self, first_window: int = 0) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(number, dataset indices, their lengths)`` of every step from window
        ``first_window`` on, as ``bucket_window`` deals them (:meth:`step`; the dropped step is
        dealt, not planned, so left out), one window laid out (and read) at a time."""
        if self.window is None:
            raise ValueError("dealt_steps needs bucket_window")
        for window in range(first_window, -(-self._total // self.window)):
            for offset, step in enumerate(zip(*self._dealt_window(window), strict=True)):
                number = window * self.window + offset
                if number < self.n_steps:
                    yield number, *step

    def step_fill(self, m: int) -> np.ndarray:
        """int64 ``[n_steps, 4]`` with ``group_ids``, per step before bucketing: its groups of
        ``m`` samples or more, the samples of its smaller groups, its samples and its groups.
        At most ``first + second // m`` ranks can each get ``m`` of the step's samples, each
        group on one rank (the planner's rule: ``_problem.Problem.fillable_ranks``)."""
        if self._unit_starts is None or self._step_starts is None:
            raise ValueError("step_fill needs group_ids")
        sizes = np.diff(self._unit_starts)
        whole = sizes >= m
        per_unit = np.stack([whole, np.where(whole, 0, sizes), sizes, np.ones_like(sizes)], 1)
        per_unit = per_unit.astype(np.int64)
        blocks = (
            per_unit[self._units(a, min(a + _SUM_CHUNK, self._n_units))]
            for a in range(0, self._n_units, _SUM_CHUNK)
        )
        return _sums_between(blocks, self._step_starts[: self.n_steps + 1])

    def largest_unit(self) -> int:
        """Samples of the largest unit (1 without groups; 0 without samples)."""
        if self._unit_starts is None:
            return min(1, self._n_units)
        return int(np.diff(self._unit_starts).max(initial=0))

    def unit_first_sample(self, unit: int) -> int:
        """The dataset index of the first sample of ``unit`` (a group, in order of first
        appearance; without groups the sample ``unit`` itself)."""
        if self._members is None or self._unit_starts is None:
            return unit
        return int(self._members[self._unit_starts[unit]])

    def _sample_step_sums(self, values: Callable[[Any], np.ndarray]) -> np.ndarray:
        """``step_sums`` without groups: each sample's step from its shuffled position (the
        inverse permutation), the samples taken in dataset order."""
        kept = min(self.n_steps * self.size, self._n_units)  # positions of the planned steps
        sums: np.ndarray | None = None
        for a in range(0, self._n_units, _SUM_CHUNK):
            samples = np.arange(a, min(a + _SUM_CHUNK, self._n_units), dtype=np.int64)
            positions = samples if self._permutation is None else self._permutation.inverse(samples)
            planned = positions < kept  # not the dropped last step
            rows = values(slice(a, a + samples.size))[planned]  # a slice: one read of a file
            sums = _add_rows(sums, positions[planned] // self.size, rows, self.n_steps)
        return np.zeros((self.n_steps, 0), dtype=np.int64) if sums is None else sums

    def unit_sums(self, values: Callable[[Any], np.ndarray]) -> np.ndarray:
        """int64 ``[n_units, f]``: the sum of ``values`` (as in ``step_sums``) over each group's
        samples, groups in order of first appearance (with ``group_ids`` only)."""
        members, starts = self._members, self._unit_starts
        if members is None or starts is None:
            raise ValueError("unit_sums needs group_ids")
        blocks = (
            values(members[a : a + _SUM_CHUNK].astype(np.int64))
            for a in range(0, members.size, _SUM_CHUNK)
        )
        return _sums_between(blocks, starts)

    def step(self, number: int) -> np.ndarray:
        """Dataset indices (int64) of step ``number`` in ``[0, n_steps)``, in planning order."""
        if not 0 <= number < self.n_steps:
            raise ValueError(f"step must be in [0, {self.n_steps}), got {number}")
        return self._step(number)

    def _step(self, number: int) -> np.ndarray:
        if self.window is None:
            return self._raw_step(number)
        window = number // self.window
        if self._window_cache is None or self._window_cache[0] != window:
            self._window_cache = (window, self._bucket(window))
        return self._window_cache[1][number - window * self.window]

    def _units(self, first: int, stop: int) -> np.ndarray:
        """Unit ids at permuted positions ``[first, stop)``."""
        positions = np.arange(first, stop, dtype=np.int64)
        return positions if self._permutation is None else self._permutation(positions)

    def _unit_list(self, number: int) -> list[np.ndarray]:
        """The units of step ``number`` (before bucketing), each as its dataset indices."""
        if self._step_starts is None:
            return list(self._raw_step(number).reshape(-1, 1))
        starts, members = self._unit_starts, self._members
        first, stop = int(self._step_starts[number]), int(self._step_starts[number + 1])
        # Permuted a block of steps' units at a time: one call per step (some 30 units) was
        # most of a pass over every step's groups (adv18a F2's check: 4.4 of 7.8 s for 1M).
        block = self._unit_block  # read once: a planner thread may replace it meanwhile
        if block is None or not block[0] <= first <= stop <= block[0] + block[1].size:
            block = (first, self._units(first, max(stop, min(first + _UNIT_BLOCK, self._n_units))))
            self._unit_block = block
        units = block[1][first - block[0] : stop - block[0]]
        return [members[starts[u] : starts[u + 1]].astype(np.int64) for u in units.tolist()]  # type: ignore[index]

    def _raw_step(self, number: int) -> np.ndarray:
        if self._step_starts is None:
            first = number * self.size
            return self._units(first, min(first + self.size, self._n_units))
        units = self._unit_list(number)
        return np.concatenate(units) if units else np.empty(0, dtype=np.int64)

    def _fill_steps(self) -> np.ndarray:
        """Unit positions where each step starts (and the end): whole units while they fit."""
        sizes = np.diff(self._unit_starts)  # type: ignore[arg-type]
        if self._n_units == 0:
            return np.zeros(1, dtype=np.int64)
        ordered = (
            sizes
            if self._permutation is None
            else np.concatenate(
                [
                    sizes[self._units(a, min(a + _CHUNK, self._n_units))]
                    for a in range(0, self._n_units, _CHUNK)
                ]
            )
        )
        ends = np.cumsum(ordered)
        bounds = [0]
        while bounds[-1] < self._n_units:
            before = 0 if bounds[-1] == 0 else int(ends[bounds[-1] - 1])
            # The last unit whose running total stays within the step (at least one unit).
            stop = int(np.searchsorted(ends, before + self.size, side="right"))
            bounds.append(max(stop, bounds[-1] + 1))
        return np.asarray(bounds, dtype=np.int64)

    def _bucket(self, window: int) -> list[np.ndarray]:
        """Steps of one window, dealt by length in snake order (``plan_epoch``)."""
        return self._dealt_window(window)[0]

    def _dealt_window(self, window: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """:meth:`_bucket`'s steps and each one's lengths (int64, in its order), from the one
        read of the window's lengths the deal makes (a check of every dealt step read each
        step's lengths again: one file read per step)."""
        first = window * self.window  # type: ignore[operator]
        numbers = range(first, min(first + self.window, self._total))  # type: ignore[operator]
        group = [self._unit_list(s) for s in numbers]
        units = [u for step in group for u in step]
        room = [sum(u.size for u in step) for step in group]
        # The window's lengths in one read (a file: one pread per run, not one per unit).
        sizes = np.array([u.size for u in units], dtype=np.int64)
        read = np.asarray(self.lengths[np.concatenate(units)], dtype=np.int64) if units else sizes
        weight = np.add.reduceat(read, np.cumsum(sizes) - sizes) if units else sizes
        dealt: list[list[int]] = [[] for _ in group]  # the units of each step, by position
        k = len(group)
        snake = [*range(k), *range(k - 1, -1, -1)]
        cursor = 0
        for i in np.argsort(-weight, kind="stable").tolist():
            for tries in range(2 * k):
                target = snake[(cursor + tries) % (2 * k)]
                if room[target] >= sizes[i]:
                    break
            else:  # unequal groups did not fit: keep this window as it was
                ends = np.cumsum([len(step) for step in group]).tolist()
                dealt = [list(range(e - len(step), e)) for step, e in zip(group, ends, strict=True)]
                break
            dealt[target].append(i)
            room[target] -= int(sizes[i])
            cursor = (cursor + tries + 1) % (2 * k)
        pieces = np.split(read, np.cumsum(sizes)[:-1]) if units else []  # each unit's lengths
        rng = np.random.default_rng((self.seed, self.epoch, window))
        steps, lengths = [], []
        for chosen in dealt:
            indices = np.concatenate([units[i] for i in chosen]) if chosen else sizes[:0]
            values = np.concatenate([pieces[i] for i in chosen]) if chosen else sizes[:0]
            order = rng.permutation(indices.size)
            steps.append(indices[order])
            lengths.append(values[order])
        return steps, lengths


def _add_rows(
    sums: np.ndarray | None, steps: np.ndarray, rows: np.ndarray, n_steps: int
) -> np.ndarray:
    """``sums`` (int64 ``[n_steps, f]``, None: zeros) plus each row of ``rows`` at its step."""
    if sums is None:
        sums = np.zeros((n_steps, rows.shape[1]), dtype=np.int64)
    for column in range(rows.shape[1]):  # float64 weights: exact below 2**53
        sums[:, column] += np.bincount(steps, weights=rows[:, column], minlength=n_steps).astype(
            np.int64
        )
    return sums


def _sums_between(blocks: Iterator[np.ndarray], bounds: np.ndarray) -> np.ndarray:
    """int64 ``[len(bounds) - 1, f]``: the sums of the rows between consecutive ``bounds``
    (ascending row positions, the first 0) of the row blocks concatenated, block by block."""
    at = np.zeros((bounds.size, 0), dtype=np.int64)
    carry: np.ndarray | None = None
    done = 0
    for block in blocks:
        running = np.cumsum(block, axis=0)
        if carry is None:
            at = np.zeros((bounds.size, block.shape[1]), dtype=np.int64)
            carry = np.zeros(block.shape[1], dtype=np.int64)
        running += carry
        first, stop = np.searchsorted(bounds, [done, done + block.shape[0]], side="right")
        at[first:stop] = running[bounds[first:stop] - done - 1]
        carry, done = running[-1], done + block.shape[0]
    return np.diff(at, axis=0)


def _group_members(group_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Samples of each group, groups in order of first appearance: ``(members, starts)``,
    members compact (``uint32`` while the sample count allows) and ``starts`` of size
    groups + 1."""
    unit = unit_numbers(group_ids, group_ids.size)
    sizes = np.bincount(unit)  # units are numbered 0..k-1, each present: k entries
    dtype = np.uint32 if group_ids.size < 2**32 else np.int64
    members = np.argsort(unit, kind="stable").astype(dtype)
    starts = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    return members, starts
