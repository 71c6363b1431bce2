"""A streaming buffer that turns a continuous flow of samples into balanced optimizer steps.

Producers (rollout workers, on-the-fly packers) push samples as they arrive; the buffer holds
up to ``window`` of them and, on each dispatch, chooses ``batch_size`` samples that plan well
across ``dp_size`` ranks. A sample never waits more than ``max_delay`` dispatches: selection is
earliest-deadline-first for the samples that must go now, and balance-driven for the rest.

Samples may carry parts (images, HSTU fields): push a :class:`seqbalance.cost.SampleParts`
instead of lengths, and every dispatch is planned on its samples' parts (``max_vision_patches``,
a cost model that ``accepts_parts``) and hands them back per rank and micro-batch.

Pure Python + numpy: it needs no torch.distributed (run it on the producer, or on every rank
with the same input stream).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import as_lengths, check_bounded_count, check_int, check_ranks
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.cost.samples import SampleParts
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import plan_step, vision_patches_of
from seqbalance.runtime.closed_loop.planner import AdaptivePlanner
from seqbalance.runtime.closed_loop.settings import Feedback, as_feedback
from seqbalance.runtime.rebalancing.caps import first_over_cap

if TYPE_CHECKING:
    from seqbalance.plan import StepPlan

__all__ = ["Dispatch", "WindowBalancer"]

_MAX_WINDOW = 2**53
"""Most samples a window may buffer (each is held in Python lists: a larger one is a mistake)."""
_MAX_DELAY = 2**62
"""Largest ``max_delay``: a sample's deadline (its push's dispatch number plus it) is int64, so a
larger one overflowed (OverflowError at the first dispatch) or wrapped to a negative deadline,
every sample then due at once."""

_ID_LIMIT = 2**63
"""Ids are int64: the running counter stops below this."""

_OFFSETS = 4
"""Runs of similar cost tried per candidate family (the planner scores each); bounds the cost."""


@dataclass(frozen=True)
class Dispatch:
    """One dispatched optimizer step.

    Attributes:
        ids: the id of each plan position: ``plan.ranks[r][j]`` holds plan positions, so
            ``ids[plan.ranks[r][j]]`` are the ids of rank ``r``'s micro-batch ``j`` (see
            :meth:`rank_ids`).
        lengths: token length of each plan position (``parts.tokens`` when parts were pushed).
        waited: how many earlier dispatches passed each sample over (``<= max_delay``).
        plan: the step's plan; ``None`` only for the last dispatch of ``flush()`` when its
            samples could not be planned (``unplanned`` says why).
        items: the objects pushed with the samples, if any.
        index: the dispatch's number, from 0.
        unplanned: why ``plan`` is ``None`` (the planner's error), else ``None``.
        parts: the samples' ``SampleParts`` by plan position, when parts were pushed (see
            :meth:`rank_parts`); else ``None``.
    """

    ids: np.ndarray
    lengths: np.ndarray
    waited: np.ndarray
    plan: StepPlan | None
    items: list[Any] | None
    index: int
    unplanned: str | None = None
    parts: SampleParts | None = None
    _balancer: str = field(default="", repr=False, compare=False)  # who made it (observe)

    def rank_ids(self, rank: int) -> list[np.ndarray]:
        """Sample ids of each micro-batch of ``rank`` (ValueError: no such rank, or no plan)."""
        return [self.ids[microbatch] for microbatch in self._microbatches(rank)]

    def rank_items(self, rank: int) -> list[list[Any]]:
        """Pushed objects of each micro-batch of ``rank`` (requires ``items`` at push time)."""
        if self.items is None:
            raise ValueError("no items were pushed with these samples; use rank_ids instead")
        return [[self.items[int(k)] for k in mb] for mb in self._microbatches(rank)]

    def rank_parts(self, rank: int) -> list[SampleParts]:
        """Parts of each micro-batch of ``rank``, its samples in ``rank_ids`` order (requires
        parts at push time): ``rank_parts(r)[j].grid_thw`` are the images of micro-batch ``j``."""
        if self.parts is None:
            raise ValueError("no parts were pushed with these samples; use rank_ids instead")
        return [self.parts.take(mb) for mb in self._microbatches(rank)]

    def _microbatches(self, rank: int) -> list[np.ndarray]:
        if self.plan is None:
            raise ValueError(
                f"dispatch {self.index} holds {self.ids.size} samples that could not be "
                f"planned: {self.unplanned}"
            )
        dp = self.plan.dp_size
        if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
            raise ValueError(f"rank must be an integer in [0, {dp}), got {rank!r}")
        if not 0 <= rank < dp:
            raise ValueError(f"rank must be in [0, dp_size = {dp}), got {rank}")
        return self.plan.ranks[int(rank)]


class WindowBalancer:
    """Buffer up to ``window`` samples and dispatch balanced steps of ``batch_size`` samples.

    Args:
        dp_size: data-parallel ranks each step is planned for (1 to 2**18).
        batch_size: samples per dispatched step (global, over all ranks).
        window: most samples buffered at once (default ``4 * batch_size``, at most 2**53);
            ``push`` beyond it raises. Must satisfy ``batch_size <= window <= batch_size *
            (max_delay + 1)`` so the delay bound can always be honoured.
        max_delay: most dispatches a sample may be passed over (at most 2**62). Default: ``2 *
            ceil(window / batch_size) - 1``, twice what a first-in first-out buffer would make a
            sample wait (less one). The smallest value the window allows, ``ceil(window /
            batch_size) - 1``, makes every buffered sample due as soon as the window is full, which
            leaves no choice and so no balancing; with the default, about a fifth of each dispatch
            is forced by deadlines on a steady stream and the rest is chosen for balance
            (``benchmarks/window.py`` measures the effect).
        options: the :class:`seqbalance.PlanOptions` of every dispatched step;
            ``option_keywords`` (any ``PlanOptions`` field by name) are applied on top. Checked
            here, at construction.
        adaptive: ``True`` or a :class:`seqbalance.runtime.Feedback`: plan each dispatch
            with the cost model and rank speeds learned from measured time (an
            :class:`seqbalance.runtime.AdaptivePlanner`, :attr:`adaptive`): after a
            step ran, hand every rank's measured seconds to :meth:`observe`; the update applies
            from the next dispatch. ``Feedback(prior=..., log=...)`` sets the model it starts
            from (default: ``cost`` as seconds) and a JSONL file of each step's telemetry.
        **option_keywords: any ``PlanOptions`` field by name.

    Selection at each dispatch: first the fewest earliest-deadline samples that must leave now
    so that every later dispatch can still meet every deadline; then, among candidate
    selections (those samples plus the oldest others, those samples plus runs of similar
    length, and runs of similar length over the whole window that leave every deadline
    feasible) the one whose plan (:func:`seqbalance.plan.plan_step`) has the lowest predicted
    imbalance (ties prefer the oldest). At most ``1 + 2 * 4`` plans per dispatch. A candidate
    that cannot be planned is skipped; when none can, the candidates are planned again with
    ``allow_empty=True`` (fewer samples than micro-batch slots, e.g. the end of a stream).

    Context parallelism is refused (a ValueError naming the classes that take it): the window
    selects its dispatches by the imbalance of data-parallel plans and hands out micro-batches
    of whole samples; a stream with samples longer than one rank can hold goes through the
    ``Rebalancer`` (or ``BalancedBatchSampler``) with ``context_parallel``.

    Raises:
        ValueError: a bad argument or option (named), ``context_parallel``.
    """

    def __init__(
        self,
        dp_size: int,
        batch_size: int,
        *,
        window: int | None = None,
        max_delay: int | None = None,
        options: PlanOptions | None = None,
        adaptive: bool | Feedback = False,
        **option_keywords: Any,
    ) -> None:
        self.dp_size = check_ranks(dp_size, "dp_size")
        # Bounded before the window it sets is named instead (the default is 4 x batch_size).
        self.batch_size = check_bounded_count(
            batch_size,
            "batch_size",
            most=_MAX_WINDOW if window is not None else _MAX_WINDOW // 4,
            unit="" if window is not None else " with the default window (4 x batch_size)",
        )
        self.window = check_int(
            4 * self.batch_size if window is None else window, "window", minimum=self.batch_size
        )
        if self.window > _MAX_WINDOW:
            raise ValueError(f"window must be <= 2**53 = {_MAX_WINDOW}, got {self.window}")
        if max_delay is None:
            max_delay = 2 * -(-self.window // self.batch_size) - 1
        self.max_delay = check_int(max_delay, "max_delay", minimum=0)
        if self.max_delay > _MAX_DELAY:
            raise ValueError(f"max_delay must be <= 2**62 = {_MAX_DELAY}, got {self.max_delay}")
        if self.window > self.batch_size * (self.max_delay + 1):
            raise ValueError(
                f"window = {self.window} can hold more samples than {self.max_delay + 1} "
                f"dispatches of batch_size = {self.batch_size} can drain, so max_delay = "
                f"{self.max_delay} could not be honoured; use window <= "
                f"{self.batch_size * (self.max_delay + 1)} or a larger max_delay"
            )
        self.options = as_options(options, option_keywords, where="WindowBalancer")
        feedback = as_feedback(adaptive)
        self.adaptive = None
        if feedback is not None:
            self.adaptive = AdaptivePlanner(self.dp_size, self.options, feedback=feedback)
        # Stamped on every dispatch: observe() refuses another balancer's (learned as this
        # one's step due, silently, before). A deep copy gets a stamp of its own and takes the
        # stamps its original takes (__deepcopy__), so copies of one template refuse each
        # other's dispatches and still take the template's.
        self._stamp = uuid.uuid4().hex
        self._taken_stamps = frozenset({self._stamp})
        self._ids: list[int] = []
        self._buffered_ids: set[int] = set()  # the ids of _ids, to refuse one pushed again
        self._lengths: list[int] = []
        self._pushed_at: list[int] = []
        self._items: list[Any] = []
        self._has_items: bool | None = None
        self._has_parts: bool | None = None
        self._parts: SampleParts | None = None  # the buffered samples' parts, in buffer order
        self._next_id = 0
        self._dispatched = 0

    def __len__(self) -> int:
        """Samples currently buffered."""
        return len(self._ids)

    @property
    def dispatches(self) -> int:
        """Dispatches made so far."""
        return self._dispatched

    def push(
        self,
        lengths: Any,
        *,
        ids: Any = None,
        items: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """Buffer samples; return their ids (int64).

        Args:
            lengths: token length of each sample (an array, a sequence or any iterable), or
                the samples' ``SampleParts`` (lengths = ``parts.tokens``): their images or HSTU
                fields are then planned with them and come back in ``Dispatch.parts``. Push
                parts with every sample of the stream or with none.
            ids: one id per sample (default: a running counter), none of them a buffered
                sample's.
            items: optional, one object per sample (any iterable), handed back with the
                dispatch.

        Raises:
            ValueError: a bad length or id (one already buffered or given twice), mismatched
                sizes, items or parts with some pushes only, parts that cannot join the
                buffered ones (another ``spatial_merge_size``, HSTU fields on some only), a
                sample over
                ``max_tokens`` or ``max_vision_patches`` (without ``allow_oversize``: it could
                never be planned), samples the options cannot plan at all (the conditions of
                ``plan_step``: ``max_vision_patches`` without parts that describe images,
                images or HSTU fields with ``layout="padded"`` or with a cost model that would
                ignore them), a cost the cost model rejects, a window overflow (dispatch
                first), or running ids past 2**63 - 1 (after an id pushed that high). Nothing is
                buffered then.
        """
        parts = lengths if isinstance(lengths, SampleParts) else None
        lengths = as_lengths(_materialise(lengths if parts is None else parts.tokens), "lengths")
        if ids is None:
            if self._next_id + lengths.size > _ID_LIMIT:
                # int64 ids: np.arange past it raised OverflowError naming nothing.
                raise ValueError(
                    f"the running ids would pass 2**63 - 1 after id {self._next_id - 1} (pushed "
                    "with ids=): pass ids= for these samples too"
                )
            new_ids = np.arange(self._next_id, self._next_id + lengths.size, dtype=np.int64)
        else:
            new_ids = as_lengths(_materialise(ids), "ids")
            if new_ids.size != lengths.size:
                raise ValueError(f"ids has {new_ids.size} entries but lengths has {lengths.size}")
            self._check_unique(new_ids)
        if items is not None:
            items = list(items)
            if len(items) != lengths.size:
                raise ValueError(f"items has {len(items)} entries but lengths has {lengths.size}")
        if lengths.size and self._has_items is not None and self._has_items != (items is not None):
            raise ValueError("push items with every sample or with none")
        if lengths.size and self._has_parts is not None and self._has_parts != (parts is not None):
            raise ValueError("push parts (a SampleParts) with every sample or with none")
        buffered_parts = self._joined_parts(parts) if lengths.size else self._parts
        patches = vision_patches_of(parts, self.options)
        over = first_over_cap(lengths, patches, self.options)
        if over is not None:
            name = "lengths" if over.option == "max_tokens" else "vision_patches"
            raise ValueError(
                f"{name}[{over.index}] = {over.value} (id {int(new_ids[over.index])}) exceeds "
                f"{over.option} = {over.cap}; no step could plan it: pass allow_oversize=True to "
                "give such a sample a micro-batch of its own"
            )
        evaluate_costs(self.options.cost_model, lengths, parts)
        if len(self) + lengths.size > self.window:
            raise ValueError(
                f"pushing {lengths.size} samples would exceed window = {self.window} "
                f"({len(self)} buffered); call dispatch() first"
            )
        if lengths.size:
            self._has_items = items is not None
            self._has_parts = parts is not None
            self._parts = buffered_parts
        self._ids.extend(int(i) for i in new_ids)
        self._buffered_ids.update(int(i) for i in new_ids)
        self._lengths.extend(int(n) for n in lengths)
        self._pushed_at.extend([self._dispatched] * lengths.size)
        if items is not None:
            self._items.extend(items)
        if new_ids.size:
            self._next_id = max(self._next_id, int(new_ids.max()) + 1)
        return new_ids

    def _check_unique(self, ids: np.ndarray) -> None:
        """ValueError naming the first of ``ids`` (given to :meth:`push`) that repeats another
        of them or a buffered sample's id: a dispatch's ids name its samples, and two samples
        under one id (looked up by it) trained one of them twice and the other never."""
        pushed: dict[int, int] = {}
        for k, value in enumerate(ids.tolist()):
            if value in self._buffered_ids or value in pushed:
                owner = (
                    "a buffered sample" if value in self._buffered_ids else f"ids[{pushed[value]}]"
                )
                raise ValueError(
                    f"ids[{k}] = {value} is already the id of {owner}: give each sample its own id"
                )
            pushed[value] = k

    def _joined_parts(self, parts: SampleParts | None) -> SampleParts | None:
        """The buffered samples' parts with ``parts`` appended (``None``: a stream of lengths).

        Raises:
            ValueError: parts that cannot be concatenated with the buffered ones.
        """
        if parts is None or self._parts is None:
            return parts
        try:
            return SampleParts.concatenate([self._parts, parts])
        except ValueError as error:
            raise ValueError(f"parts cannot join the buffered samples' parts: {error}") from None

    def observe(self, dispatch: Dispatch, rank_seconds: Sequence[Any], **times: Any) -> dict:
        """With ``adaptive``: learn from every rank's measured seconds of ``dispatch``'s step
        (``AdaptivePlanner.observe``: per rank its micro-batch seconds or its total; keywords
        ``sync_seconds``, ``step_seconds``); returns the step's telemetry.

        Raises:
            ValueError: without ``adaptive``, for what is no ``Dispatch`` of this balancer (of
                another, or a plan), a dispatch without a plan, bad seconds, or a dispatch
                observed twice or while an earlier planned one was not (nothing is learned
                then).
        """
        if self.adaptive is None:
            raise ValueError("WindowBalancer.observe needs adaptive=True")
        if not isinstance(dispatch, Dispatch):
            raise ValueError(
                "dispatch must be a Dispatch of this WindowBalancer (dispatch()'s or flush()'s), "
                f"got {type(dispatch).__name__}"
            )
        if dispatch.plan is None:
            raise ValueError("this dispatch was not planned (flush's unplanned remainder)")
        if dispatch._balancer not in self._taken_stamps:
            raise ValueError(
                f"dispatch {dispatch.index} was not made by this WindowBalancer (another "
                "balancer's): its seconds would be learned as this one's step"
            )
        return self.adaptive.observe(dispatch.plan, rank_seconds, **times)

    def __deepcopy__(self, memo: dict[int, Any]) -> WindowBalancer:
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            setattr(clone, name, copy.deepcopy(value, memo))
        clone._stamp = uuid.uuid4().hex
        clone._taken_stamps = self._taken_stamps | {clone._stamp}
        return clone

    def ready(self) -> bool:
        """True when the window is full: dispatch now (more samples cannot be pushed)."""
        return len(self) >= self.window

    def dispatch(self) -> Dispatch:
        """Plan and remove one step of ``batch_size`` samples.

        Raises:
            ValueError: fewer than ``batch_size`` samples are buffered, or no candidate
                selection can be planned under the options (the buffer is left as it was;
                ``flush()`` still returns every sample).
        """
        if len(self) < self.batch_size:
            raise ValueError(
                f"dispatch needs batch_size = {self.batch_size} buffered samples, have "
                f"{len(self)}; push more, or flush() at the end of the stream"
            )
        return self._dispatch(self.batch_size)

    def flush(self) -> list[Dispatch]:
        """Dispatch everything left (the last step may hold fewer than ``batch_size``).

        Always empties the buffer: if the remaining samples cannot be planned under the
        options, they come back in one last dispatch with ``plan=None`` and the reason in
        ``unplanned``.
        """
        dispatches = []
        while len(self):
            dispatches.append(self._dispatch_or_unplanned(min(self.batch_size, len(self))))
        return dispatches

    def _dispatch_or_unplanned(self, size: int) -> Dispatch:
        """A dispatch of ``size`` samples, or of everything left, unplanned, with the reason."""
        try:
            return self._dispatch(size)
        except ValueError as error:
            return self._remove(np.arange(len(self)), None, unplanned=str(error))

    def _dispatch(self, size: int) -> Dispatch:
        lengths = np.asarray(self._lengths, dtype=np.int64)
        deadline = np.asarray(self._pushed_at, dtype=np.int64) + self.max_delay
        arrival = np.arange(lengths.size)
        urgency = np.lexsort((arrival, deadline))
        forced = urgency[: self._forced_count(deadline[urgency])]
        rest = np.setdiff1d(arrival, forced)
        free = size - forced.size
        # Candidates: forced + oldest (always feasible), forced + runs of similar length from
        # the rest, and runs of similar length over the whole window that meet every deadline.
        candidates = [np.concatenate([forced, rest[:free]])]
        candidates += [np.concatenate([forced, run]) for run in _runs(rest, lengths, free)]
        candidates += [
            run for run in _runs(arrival, lengths, size) if self._feasible(run, deadline)
        ]
        chosen, plan = self._best_selection(lengths, candidates)
        return self._remove(chosen, plan)

    def _remove(
        self, chosen: np.ndarray, plan: StepPlan | None, unplanned: str | None = None
    ) -> Dispatch:
        """Take the buffered samples at positions ``chosen`` out as the next dispatch."""
        dispatch = Dispatch(
            ids=np.asarray(self._ids, dtype=np.int64)[chosen],
            lengths=np.asarray(self._lengths, dtype=np.int64)[chosen],
            waited=self._dispatched - np.asarray(self._pushed_at, dtype=np.int64)[chosen],
            plan=plan,
            items=[self._items[k] for k in chosen] if self._has_items else None,
            index=self._dispatched,
            unplanned=unplanned,
            parts=None if self._parts is None else self._parts.take(chosen),
            _balancer=self._stamp,
        )
        if plan is not None and self.adaptive is not None:
            self.adaptive.numbered(plan)  # observe() then refuses a dispatch skipped or repeated
        keep = np.setdiff1d(np.arange(len(self)), chosen)
        self._buffered_ids.difference_update(self._ids[k] for k in chosen.tolist())
        self._ids = [self._ids[k] for k in keep]
        self._lengths = [self._lengths[k] for k in keep]
        self._pushed_at = [self._pushed_at[k] for k in keep]
        if self._has_items:
            self._items = [self._items[k] for k in keep]
        if self._parts is not None:
            self._parts = self._parts.take(keep)
        self._dispatched += 1
        return dispatch

    def _forced_count(self, sorted_deadlines: np.ndarray) -> int:
        """Fewest earliest-deadline samples to send now so every later deadline stays feasible.

        After this dispatch, ``h`` more dispatches remain before deadline ``now + h``; they carry
        ``batch_size * h`` samples, so at least ``count(deadline <= now + h) - batch_size * h``
        of those samples must leave now.
        """
        horizon = self._horizon(sorted_deadlines, sorted_deadlines.size)
        counts = np.arange(1, horizon.size + 1)
        need = counts - self.batch_size * np.maximum(horizon, 0)
        return int(min(max(need.max(initial=0), 0), self.batch_size, horizon.size))

    def _horizon(self, deadlines: np.ndarray, samples: int) -> np.ndarray:
        """Dispatches left before each of ``deadlines``, at most one more than ``samples`` (the
        buffered ones) need to drain: a farther deadline binds no more, and ``batch_size``
        times one as far as ``max_delay = 2**62`` wrapped in int64 (every sample forced, or
        no selection feasible: balancing silently off)."""
        return np.minimum(deadlines - self._dispatched, -(-samples // self.batch_size) + 1)

    def _feasible(self, chosen: np.ndarray, deadline: np.ndarray) -> bool:
        """Whether every sample left behind can still meet its deadline."""
        left = np.ones(deadline.size, dtype=bool)
        left[chosen] = False
        due, count = np.unique(deadline[left], return_counts=True)
        horizon = self._horizon(due, deadline.size)
        return bool((np.cumsum(count) <= self.batch_size * horizon).all())

    def _best_selection(
        self, lengths: np.ndarray, candidates: list[np.ndarray]
    ) -> tuple[np.ndarray, StepPlan]:
        """The candidate whose plan has the lowest predicted imbalance (ties: the earlier one).

        Candidates that cannot be planned are skipped. When none can, they are planned again
        with ``allow_empty=True``: only empty micro-batches can help then (fewer samples than
        micro-batch slots), and a stream cannot wait for samples that may never come.

        Raises:
            ValueError: no candidate can be planned even so (the first candidate's error).
        """
        current = self.options if self.adaptive is None else self.adaptive.options
        relaxed = current.replace(allow_empty=True)
        attempts = (relaxed,) if current.allow_empty else (current, relaxed)
        for options in attempts:
            # Candidate families overlap (with nothing forced, the runs over the rest are the
            # runs over the window): a set of samples is planned once, however often drawn.
            plans: dict[bytes, StepPlan | str] = {}
            planned = []
            for c in candidates:
                chosen = np.sort(c)
                key = chosen.tobytes()
                if key not in plans:
                    plans[key] = _try_plan(lengths, self._parts, chosen, self.dp_size, options)
                planned.append(plans[key])
            scored = [
                (plan.imbalance, k) for k, plan in enumerate(planned) if not isinstance(plan, str)
            ]
            if scored:
                _, best = min(scored)  # the lowest imbalance, then the earliest candidate
                return np.sort(candidates[best]), planned[best]  # type: ignore[return-value]
        raise ValueError(
            f"no selection of {candidates[0].size} buffered samples can be planned for "
            f"dp_size = {self.dp_size} under these options ({planned[0]}); flush() returns the "
            "buffered samples"
        )


def _try_plan(
    lengths: np.ndarray,
    parts: SampleParts | None,
    chosen: np.ndarray,
    dp_size: int,
    options: PlanOptions,
) -> StepPlan | str:
    """The plan of the samples ``chosen`` (with their parts, when given), or the planner's
    error message."""
    try:
        samples = lengths[chosen] if parts is None else parts.take(chosen)
        return plan_step(samples, dp_size, options)
    except ValueError as error:
        return str(error)


def _materialise(values: Any) -> Any:
    """An iterator (a generator) as a list; anything else as it is."""
    return list(values) if isinstance(values, Iterator) else values


def _runs(pool: np.ndarray, lengths: np.ndarray, size: int) -> list[np.ndarray]:
    """Up to ``_OFFSETS`` evenly spaced runs of ``size`` consecutive samples of ``pool``
    sorted by length (stable): sets of similar length, from the shortest to the longest."""
    if not 0 < size < pool.size:
        return []
    by_length = pool[np.argsort(lengths[pool], kind="stable")]
    starts = np.unique(np.linspace(0, pool.size - size, _OFFSETS).round().astype(np.int64))
    return [by_length[start : start + size] for start in starts.tolist()]
