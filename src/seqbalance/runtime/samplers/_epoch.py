"""What both samplers share: the epoch position, exact resume, ``len()``, and the check that
all data-parallel ranks set up the same sampler.

A pass over an epoch yields the micro-batches of one optimizer step after another; subclasses
say how many steps an epoch has (``_n_steps``), how many micro-batches each step has when that
is fixed (``_fixed_count``), and produce this rank's micro-batches step by step
(``_rank_steps``). The position is ``(step, offset)``: the step in progress and the
micro-batches of it already taken, so a resume never has to lay out the steps before it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from seqbalance._validation import check_bool, check_int, check_timeout
from seqbalance.cost.samples import SampleParts
from seqbalance.runtime.agreement import (
    brief,
    differing_settings,
    error_text,
    raise_gathered_error,
)
from seqbalance.runtime.samplers._lengths import LengthSource
from seqbalance.runtime.samplers._state_format import STATE_FORMAT, check_state_format

__all__ = ["EpochBatchSampler", "parts_sha256", "sha256_of"]

_STATE_KEYS = ("format", "epoch", "consumed", "step", "offset", "setup")
_POSITION = ("consumed", "step", "offset")
_PARTS_ARRAYS = ("tokens", "grid_thw", "image_sample", "history", "candidates", "contextual")


def _position_check(epoch: int, consumed: int, step: int, offset: int) -> str:
    """A short digest tying a state's position fields together: without a fixed micro-batch
    count, ``step`` / ``offset`` cannot be derived from ``consumed`` without planning every
    earlier step, so a state whose ``consumed`` was edited by hand (a prefetch correction that
    should be ``state_dict(consumed=...)``) would resume at the old step and offset: the
    micro-batches in between skipped, silently."""
    fields = json.dumps([epoch, consumed, step, offset]).encode()
    return hashlib.sha256(fields).hexdigest()[:16]


def _check_position_digest(check: Any, epoch: int, consumed: int, step: int, offset: int) -> None:
    """ValueError unless ``check`` (a state's ``position_check``; None in states saved before
    it existed) is the digest of its position fields (:func:`_position_check`)."""
    if check is None:
        return
    if not isinstance(check, str):
        raise ValueError(
            "state_dict['position_check'] must be the str state_dict() wrote, got "
            f"{type(check).__name__}"
        )
    if check != _position_check(epoch, consumed, step, offset):
        raise ValueError(
            f"state_dict's epoch / consumed / step / offset = {epoch} / {consumed} / {step} "
            f"/ {offset} were changed after state_dict() wrote them (its position_check "
            "differs): they must move together; for a DataLoader's prefetch save "
            "state_dict(consumed=trained) instead of editing 'consumed'"
        )


def sha256_of(array: np.ndarray | None) -> str | None:
    """SHA-256 of ``array`` as little-endian int64 bytes, or None."""
    if array is None:
        return None
    return hashlib.sha256(np.ascontiguousarray(array, dtype="<i8").tobytes()).hexdigest()


def parts_sha256(parts: SampleParts | None) -> str | None:
    """SHA-256 of every field of ``parts`` (each field's name and shape, then its int64 bytes),
    or None without parts."""
    if parts is None:
        return None
    digest = hashlib.sha256(f"spatial_merge_size={parts.spatial_merge_size};".encode())
    for name in _PARTS_ARRAYS:
        value = getattr(parts, name)
        shape = None if value is None else list(value.shape)
        digest.update(f"{name}={shape};".encode())
        if value is not None:
            digest.update(np.ascontiguousarray(value, dtype="<i8").tobytes())
    return digest.hexdigest()


def _setup_of(payload: bytes) -> dict[str, Any] | None:
    """A rank's agreement payload as a dict, or None when it is not one (that rank is in
    another gather)."""
    try:
        setup = json.loads(payload)
    except ValueError:
        return None
    return setup if isinstance(setup, dict) and "sampler" in setup else None


def _plain(setup: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``setup`` after a JSON round trip, the form ranks send each other and a state saved as
    JSON takes: compared so, an option held as a tuple (``rank_speeds``) equals the list it
    travels as, and a legitimate resume or agreement is not refused for its container type.

    Raises:
        ValueError: ``setup`` holds what JSON cannot write (keys that are no str, number or
            None)."""
    try:  # the order kept: changes are named in the setup's order
        return json.loads(json.dumps(dict(setup), default=str))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} is not a setup state_dict() writes: {error}") from None


_DIGESTS = ("lengths", "groups", "parts", "costs")
"""Setup entries that hold a SHA-256 of the data rather than the data (said so when named)."""


def _changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two setups (as :func:`_plain` gives them), in words, the
    data-parallel rank left out (it may differ) and the options named one by one
    (``options.max_tokens``)."""
    # Named in the order of the setup in use, entries only the saved one has last.
    changes = differing_settings(_compared(now), _compared(saved), _now_and_saved)
    if not changes and saved.get("options") != now.get("options"):
        # Equal option values under another fingerprint: options of another PlanOptions format.
        return ["options (another PlanOptions fingerprint)"]
    return changes


def _compared(setup: Mapping[str, Any]) -> dict[str, Any]:
    """``setup`` without the data-parallel rank, its options as their values (their
    fingerprint is a digest of them, which would name no option)."""
    compared = {name: value for name, value in setup.items() if name != "dp_rank"}
    options = compared.get("options")
    if isinstance(options, Mapping) and isinstance(options.get("values"), Mapping):
        compared["options"] = options["values"]
    return compared


def _now_and_saved(name: str, now: str, saved: str) -> str:
    """One setup entry that changed, in words."""
    digest = "sha256 " if name in _DIGESTS else ""
    return f"{name} ({digest}{saved} saved, {now} now)"


class EpochBatchSampler:
    """Shared epoch, resume and agreement logic (module docstring)."""

    def __init__(
        self,
        lengths: Any,
        *,
        position: tuple[int, int],
        group: Any,
        seed: int,
        drop_last: bool,
        agreement_timeout: float | None,
    ) -> None:
        self._source = lengths if isinstance(lengths, LengthSource) else LengthSource(lengths)
        self.dp_rank, self.dp_size = position
        self.seed = check_int(seed, "seed", minimum=0)
        self.drop_last = check_bool(drop_last, "drop_last")
        self.agreement_timeout = (
            None
            if agreement_timeout is None
            else check_timeout(agreement_timeout, "agreement_timeout")
        )
        self._group = group
        self.epoch = 0
        self._resume: tuple[int, int, int] | None = None  # (consumed, step, offset) to go on at
        self._agreed_epoch: int | None = None
        # An error of this rank's construction kept for the first agreement (_defer_failure).
        self._failed: Exception | None = None
        # Passes are numbered; an iterator of an older pass raises instead of yielding. A loop
        # that drops its iterator (break, exception) lets it be finalised, which stops its
        # planner thread; a new pass stops the old one's planner (``_stop_planner``) at once.
        self._pass = 0
        self._stop_planner: Callable[[], None] | None = None
        self._start_pass(0, 0, 0)

    @property
    def lengths(self) -> np.ndarray:
        """The samples' token lengths as given (a memory map stays one)."""
        return self._source.values

    @property
    def checked_lengths(self) -> Any:
        """The samples' token lengths to index (``checked_lengths[indices]``), a file's read
        with ``pread`` and checked as the sampler reads it: a file changed under the sampler
        is a ValueError, where reading the memory map :attr:`lengths` of a truncated file ends
        the process with SIGBUS. Small and picklable (DataLoader workers take it)."""
        return self._source.reader

    # ---------------------------------------------------------------- subclass interface
    def _n_steps(self, epoch: int) -> int:
        """Optimizer steps of ``epoch``."""
        raise NotImplementedError

    def _fixed_count(self) -> int | None:
        """Micro-batches of every step when fixed, else None."""
        raise NotImplementedError

    def _rank_steps(self, epoch: int, first: int) -> Iterator[Sequence[Sequence[int]]]:
        """This rank's micro-batches of each step from ``first`` on, step by step (each a
        sequence of dataset indices: a list, or a ``ContextParallelSlot``)."""
        raise NotImplementedError

    def _check_epoch(self, epoch: int) -> None:
        """Raise ValueError when ``epoch`` has a step that cannot be planned, known without
        planning (before ``iter`` yields anything, and before ``len`` promises its steps)."""

    def _agreement(self) -> dict[str, Any]:
        """What ranks compare besides the setup: what shapes their plans but may differ across
        a resume (JSON-ready values)."""
        return {}

    def _saved_setup(self, saved: Mapping[str, Any]) -> Mapping[str, Any]:
        """A saved setup as this version writes it (entries added since read as the epochs
        that state was saved from were laid out)."""
        return saved

    def _setup(self) -> dict[str, Any]:
        """Everything the layout depends on besides the epoch (JSON-ready values)."""
        return {
            "sampler": type(self).__name__,
            "num_samples": self._source.size,
            "lengths": self._source.sha256(),
            "seed": self.seed,
            "drop_last": self.drop_last,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
        }

    # ---------------------------------------------------------------- iteration
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate next.

        Another epoch than the current one starts it afresh: a loaded resume point is
        discarded, a running pass of the old epoch ends (its iterator raises RuntimeError if
        used again) and the position is the new epoch's start, so ``state_dict`` never records
        the old epoch's position under the new epoch's number (a resume would skip work never
        trained). The same epoch changes nothing.
        """
        epoch = check_int(epoch, "epoch", minimum=0)
        if epoch != self.epoch:
            self.close()
            self._resume = None
            # A pass's start, as iter() makes it: an adaptive sampler numbers the new epoch's
            # steps after the ones observed, so state_dict() before the next iter() is valid.
            self._start_pass(0, 0, 0)
        self.epoch = epoch

    def _set_position(self, consumed: int, step: int, offset: int) -> None:
        """Where the epoch stands (what ``state_dict`` records) before the next batch."""
        self._base = (consumed, step, offset)
        self._consumed = consumed
        self._counts = array("L")  # micro-batches of each step this pass has started

    def _start_pass(self, consumed: int, step: int, offset: int) -> None:
        self._set_position(consumed, step, offset)

    def __iter__(self) -> Iterator[Sequence[int]]:
        # Checked and positioned now, not at the first next(): a disagreement fails before any
        # data is yielded, and state_dict() right after iter() describes the new pass.
        self.close()
        self.check_agreement()  # first: ranks that differ fail together, before any local check
        self._check_epoch(self.epoch)
        # A loaded resume point is kept until this pass takes its first batch (_yield_from): a
        # DataLoader with workers calls iter() twice before taking any, and a second iter()
        # that started the epoch afresh would train everything before the resume point again.
        consumed, step, offset = self._resume or (0, 0, 0)
        self._start_pass(consumed, step, offset)
        return self._yield_from(self.epoch, step, offset, self._pass)

    def _yield_from(self, epoch: int, step: int, offset: int, mine: int) -> Iterator[Sequence[int]]:
        self._check_current(mine)
        self._resume = None  # taken by this pass: a later iter() starts the epoch anew
        steps = self._rank_steps(epoch, step)
        try:
            for number in itertools.count(step):
                self._check_current(mine)
                try:
                    batches = next(steps)
                except StopIteration:
                    return
                except RuntimeError:
                    self._check_current(mine)  # a planner stopped by a newer pass
                    raise
                skip = offset if number == step else 0
                if skip > len(batches):
                    raise ValueError(
                        f"the resume point is micro-batch {skip} of step {number}, which has "
                        f"{len(batches)}: the state comes from another plan"
                    )
                self._counts.append(len(batches))
                for batch in batches[skip:]:
                    self._check_current(mine)
                    self._consumed += 1
                    yield batch
        finally:
            steps.close()

    def _check_current(self, mine: int) -> None:
        if self._pass != mine:
            raise RuntimeError(
                f"this iterator of {type(self).__name__} belongs to a pass that a later iter(), "
                "load_state_dict() or close() ended; iterate the sampler anew"
            )

    def close(self) -> None:
        """End the running pass and stop its background planner; its iterator raises
        RuntimeError if used again, and the next ``iter`` starts anew."""
        self._pass += 1
        if self._stop_planner is not None:
            self._stop_planner()
            self._stop_planner = None

    def __len__(self) -> int:
        """Micro-batches this rank yields per epoch (the same on every rank), when every step
        has a fixed number of them.

        Raises:
            TypeError: the micro-batch count of a step is the planner's choice
                (``num_microbatches`` not set), so the epoch's total is known only once every
                step is planned. Trainers read this as "no length" (Hugging Face ``Trainer``
                then needs ``max_steps``; Lightning and accelerate iterate to the end).
                ``num_steps`` is exact without planning.
            ValueError: a step of the epoch cannot be planned (fewer samples than micro-batch
                slots without ``allow_empty``): the epoch would end there, short of the count.
        """
        fixed = self._fixed_count()
        if fixed is None:
            raise TypeError(
                f"{type(self).__name__} has no len() without num_microbatches: each step's "
                "micro-batch count is chosen when the step is planned (set num_microbatches for "
                "an exact len(), or use num_steps and max_steps)"
            )
        self._check_epoch(self.epoch)
        return fixed * self._n_steps(self.epoch)

    @property
    def num_steps(self) -> int:
        """Optimizer steps in the current epoch (exact, without planning)."""
        return self._n_steps(self.epoch)

    # ---------------------------------------------------------------- agreement
    def check_agreement(self) -> None:
        """Where torch.distributed runs: one all_gather of the setup over the group (the
        data-parallel group, else the world); every rank raises if any rank differs.

        Done once per epoch by ``iter``, before any data is yielded, and again after
        ``load_state_dict``.

        Raises:
            ValueError: the same on every rank, naming the first rank that differs from rank 0
                and what differs (lengths, options, cost,
                seed, batch sizes, epoch, data-parallel size, the resume point loaded), or
                data-parallel ranks not held equally often (the same ``dp_rank`` twice), or
                a rank that cannot describe its setup (its lengths file changed): named.
            CollectiveError: a rank did not take part within ``agreement_timeout`` seconds.
        """
        if not self._agreement_runs():
            self._unless_failed()
            return
        if self._agreed_epoch == self.epoch:
            return
        from seqbalance.runtime.collectives import Comm, deadline

        comm = Comm(self._group, deadline(self.agreement_timeout, "agreement_timeout"))
        mine, own = self._agreement_payload()
        # In the setup's order (the changes are named in it): every rank reads the same bytes.
        payload = json.dumps(mine, default=str).encode()
        gathered = comm.all_gather_bytes(payload, f"{type(self).__name__} agreement check")
        setups = [_setup_of(other) for other in gathered]
        silent = next((r for r, setup in enumerate(setups) if setup is None), None)
        if silent is not None:
            raise ValueError(
                f"{type(self).__name__}: rank {silent} of the group sent no sampler setup to "
                f"the agreement check that starts this pass ({gathered[silent][:60]!r}): it is "
                "in another collective, e.g. the observe() of a step another rank did not "
                "observe (adaptive: every rank observes every step once), or ranks iterate the "
                "sampler a different number of times"
            )
        errors = [setup.get("error") for setup in setups]
        first = next((rank for rank, text in enumerate(errors) if text is not None), 0)
        stage = setups[first].get("stage", "construction")
        raise_gathered_error(errors, own=own, what=f"{type(self).__name__} {stage} on ")
        # Every rank compares each rank with rank 0, not with itself, so every rank raises the
        # same message (compared with itself, each rank named the other: two messages).
        for other_rank, theirs in enumerate(setups[1:], start=1):
            changes = _changes(setups[0], theirs)
            if changes:  # more than the data-parallel rank differs
                raise ValueError(
                    f"{type(self).__name__}: ranks 0 and {other_rank} of the group set up "
                    f"their samplers differently (rank 0's value 'saved', rank {other_rank}'s "
                    "'now'): "
                    + "; ".join(changes)
                    + ". Every data-parallel rank must build the sampler from the same "
                    "lengths, options, seed and batch sizes (and resume from the same "
                    "state_dict), or samples are trained twice and others never"
                )
        self._check_positions([setup["dp_rank"] for setup in setups])
        self._agreed_epoch = self.epoch

    def _agreement_payload(self) -> tuple[dict[str, Any], Exception | None]:
        """What this rank sends the agreement check, and the error it raises once the others
        are told (None: no error). An error found here, on this rank alone (its lengths file
        changed under it since the last epoch), travels in the payload as a construction error
        does: raised before the gather, it left the others waiting there until the timeout,
        their CollectiveError naming no cause."""
        name = type(self).__name__
        if self._failed is not None:  # this rank's construction error, for every rank
            return {"sampler": name, "error": error_text(self._failed)}, self._failed
        # The resume point too: ranks that loaded different states (a rank's checkpoint taken
        # at another count) would train different steps and end the epoch apart.
        resume = None if self._resume is None else dict(zip(_POSITION, self._resume, strict=True))
        try:
            setup = {**self._setup(), **self._agreement()}
        except Exception as error:  # told to every rank, then raised here
            stage = f"agreement check of epoch {self.epoch}"
            return {"sampler": name, "error": error_text(error), "stage": stage}, error
        return {**setup, "epoch": self.epoch, "resume_point": resume}, None

    def _agreement_runs(self) -> bool:
        """Whether :meth:`check_agreement` gathers: an ``agreement_timeout`` and a process
        group (without torch.distributed imported no process group can exist, and importing
        torch here would cost the first micro-batch half a second)."""
        dist = sys.modules.get("torch.distributed")
        return (
            self.agreement_timeout is not None
            and dist is not None
            and dist.is_available()
            and dist.is_initialized()
        )

    def _defer_failure(self, error: Exception) -> None:
        """Keep ``error`` (this rank's construction failed with it) for the first agreement,
        where it reaches every rank ('rank 1: IndexError: ...'; this rank raises it as it is),
        or raise it now where no agreement runs. Raised at construction on this rank alone,
        an error of user code (a cost table's IndexError) or a refusal of what it returned
        (ValueError: a NaN in one rank's table) left the other ranks waiting in their
        agreement until the timeout, their CollectiveError naming no cause. Until then every
        use of the sampler that reads what failed raises it (:meth:`_unless_failed`)."""
        if not self._agreement_runs():
            raise error
        self._failed = error

    def _unless_failed(self) -> None:
        """Raise the construction error :meth:`_defer_failure` kept, if any."""
        if self._failed is not None:
            raise self._failed

    def _check_positions(self, dp_ranks: list[Any]) -> None:
        """ValueError unless every data-parallel rank is held by as many of the group's
        processes as any other (one each on the data-parallel group; tensor-parallel peers on
        the world share one): two processes given the same ``dp_rank``, or a ``dp_size`` larger
        than the ranks that run, would train some samples twice and others never."""
        held = [dp_ranks.count(rank) for rank in range(self.dp_size)]
        if min(held) != max(held):
            raise ValueError(
                f"{type(self).__name__}: the group's processes hold data-parallel ranks "
                f"{brief(dp_ranks, 120)} (in group order), not each of the {self.dp_size} "
                "equally often: give every process its own dp_rank (or pass group=, the "
                "data-parallel group), or samples are trained twice and others never"
            )

    # ---------------------------------------------------------------- resume
    def _position_of(self, consumed: int) -> tuple[int, int]:
        """``(step, offset)`` after ``consumed`` micro-batches of the current epoch: between
        where this pass started and what it has yielded."""
        base_consumed, step, offset = self._base
        if consumed < base_consumed:
            raise ValueError(
                f"consumed = {consumed} lies before where this pass started ({base_consumed} "
                "micro-batches): save the state during the pass that trained them"
            )
        if consumed > self._consumed:
            raise ValueError(
                f"consumed = {consumed} exceeds the {self._consumed} micro-batches this sampler "
                f"has yielded in epoch {self.epoch}"
            )
        fixed = self._fixed_count()
        if fixed is not None:
            return divmod(consumed, fixed)
        if consumed == base_consumed:
            return step, offset
        rest = consumed - base_consumed + offset
        for count in self._counts:
            if rest < count:
                return step, rest
            rest -= count
            step += 1
        return step, 0

    def state_dict(self, *, consumed: int | None = None) -> dict[str, Any]:
        """Resume point: the epoch, the micro-batches consumed in it on this rank (and the step
        and offset they end at), and the setup the layout depends on.

        Args:
            consumed: overrides the count of batches the sampler has yielded; pass the number
                your training loop has actually trained on when a DataLoader prefetches
                (module docstring of ``seqbalance.runtime.samplers``).

        Returns:
            ``{"format", "epoch", "consumed", "step", "offset", "position_check", "setup"}``
            (``position_check``: a digest of the four position fields, so a state edited by
            hand is refused at load); plain Python values (``torch.save`` and JSON both work).
        """
        position = (
            self._consumed if consumed is None else check_int(consumed, "consumed", minimum=0)
        )
        step, offset = self._position_of(position)
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "consumed": position,
            "step": step,
            "offset": offset,
            "position_check": _position_check(self.epoch, position, step, offset),
            "setup": self._setup(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next pass that runs (the first whose iterator is
        advanced; one made and superseded by another ``iter()`` before that does not count)
        yields exactly the remaining batches, and passes after it the whole epoch.

        Raises:
            ValueError: ``state`` is not a mapping, lacks a key or has one of the wrong type,
                comes from another format version, or from a sampler set up differently
                (another dataset, lengths, groups, options, cost, seed, shuffle settings, batch
                size or data-parallel size: each difference is named), or its position lies
                beyond the epoch, or its position fields were edited (``position_check``). A
                state saved on another rank of the same layout is accepted:
                every rank consumes the same number of micro-batches.
        """
        if not isinstance(state, Mapping):
            raise ValueError(
                f"state must be a mapping from state_dict(), got {type(state).__name__}"
            )
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(
                f"state_dict lacks {', '.join(map(repr, missing))}: expected a state_dict() of "
                f"{type(self).__name__} ({STATE_FORMAT})"
            )
        check_state_format(state["format"])
        saved = state["setup"]
        if not isinstance(saved, Mapping):
            raise ValueError(f"state_dict['setup'] must be a mapping, got {type(saved).__name__}")
        # The rank is recorded but may differ: every rank consumes the same number of
        # micro-batches, so one rank's checkpoint (rank 0's, as Trainer saves) resumes them all.
        changes = _changes(
            _plain(self._saved_setup(saved), "state_dict['setup']"),
            _plain(self._setup(), "this sampler's setup"),
        )
        if changes:
            raise ValueError(
                "state_dict comes from a sampler set up differently; changed: "
                + "; ".join(changes)
                + ". A resume point is only valid for the same data, options and data-parallel "
                "layout"
            )
        epoch = check_int(state["epoch"], "state_dict['epoch']", minimum=0)
        consumed = check_int(state["consumed"], "state_dict['consumed']", minimum=0)
        step = check_int(state["step"], "state_dict['step']", minimum=0)
        offset = check_int(state["offset"], "state_dict['offset']", minimum=0)
        steps = self._n_steps(epoch)
        fixed = self._fixed_count()
        if fixed is not None and consumed > fixed * steps:
            raise ValueError(
                f"state_dict['consumed'] = {consumed} exceeds the {fixed * steps} micro-batches "
                f"of epoch {epoch}"
            )
        if fixed is not None and (step, offset) != divmod(consumed, fixed):
            raise ValueError(
                f"state_dict['step'], ['offset'] = {step}, {offset} do not match consumed = "
                f"{consumed} at {fixed} micro-batches per step"
            )
        if step > steps or (step == steps and offset):
            raise ValueError(
                f"state_dict['step'] = {step} (offset {offset}) lies beyond the {steps} steps of "
                f"epoch {epoch}"
            )
        _check_position_digest(state.get("position_check"), epoch, consumed, step, offset)
        self.close()
        self.epoch = epoch
        self._resume = (consumed, step, offset)
        self._agreed_epoch = None  # the next iter compares the resume point across ranks
        self._start_pass(consumed, step, offset)

    def __getstate__(self) -> dict[str, Any]:
        # A running pass (its planner thread) does not travel.
        return {**self.__dict__, "_stop_planner": None}
