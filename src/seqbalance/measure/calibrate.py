"""Calibration: time the toy transformer on this device and fit a TimeModel to the timings.

Times forward + backward of :class:`~seqbalance.measure.toy_model.TinyCausalTransformer` over
packed micro-batches of varied sizes and compositions (one long sample, many equal ones, a
lognormal mix), fits ``seconds = t0 + t1·ΣL + t2·ΣL²`` on three quarters of them (minimising
the relative error, since the figure that matters is the error per micro-batch whatever its
size) and scores the fit on the held-out quarter with :meth:`TimeModel.score`.

:func:`calibrate` does all of it in this process (``seqbalance calibrate``); the pieces
(:func:`calibration_microbatches`, :func:`time_microbatches`, :func:`fit_time_model`) are
reused by ``seqbalance.measure.bench``, whose processes each time a share of the micro-batches
under the same load they train under, and the process helpers (:func:`available_cores`,
:func:`pin_process`) by every timed process. The context-parallel
executor's calibration (``seqbalance calibrate --context-parallel``) is
``seqbalance.measure.calibrate_context_parallel``.
torch is imported by the functions that time, so the constants and the numpy parts load without
it (the command line lists the model sizes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import as_lengths, check_choice, check_int
from seqbalance.cost import FitStats, TimeModel
from seqbalance.plan import LAYOUTS

if TYPE_CHECKING:
    import torch

    from seqbalance.measure.toy_model import TinyCausalTransformer, ToyModelConfig

__all__ = [
    "HOLDOUT_EVERY",
    "MIN_TRIALS",
    "MODEL_SIZES",
    "Calibration",
    "available_cores",
    "calibrate",
    "calibration_microbatches",
    "check_model_memory",
    "check_seed",
    "check_timed_runs",
    "check_warmup",
    "costed_lengths",
    "fit_time_model",
    "model_config",
    "pin_process",
    "resolve_device",
    "time_microbatches",
]

MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "vocab_size": 128,
        "hidden_size": 32,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_size": 64,
    },
    "small": {},
    "medium": {
        "vocab_size": 1024,
        "hidden_size": 128,
        "num_layers": 4,
        "num_heads": 4,
        "intermediate_size": 352,
    },
}
"""Toy transformer shapes as ``ToyModelConfig`` fields; ``small`` is the toy model's default."""

HOLDOUT_EVERY = 4
"""Every 4th timed micro-batch is held out of the fit, to report honest errors."""

MIN_TRIALS = 4
"""Fewest micro-batches a calibration times: 3 to fit the 3 coefficients, 1 to score them."""

MAX_TIMED_RUNS = 2**20
"""The most timed runs of a calibration, ``trials x repeats``: at a millisecond each that is
already 17 minutes; the micro-batches and their timings are held at once, so more (a typo such
as ``--trials 1000000000000``) would fill the memory before timing anything."""


@dataclass(frozen=True)
class Calibration:
    """A fitted TimeModel and how well it predicts micro-batches it was not fitted to.

    Attributes:
        time_model: The fit; its ``fit_stats`` score it on the micro-batches it was fitted to.
        heldout: :meth:`TimeModel.score` of ``time_model`` on the held-out micro-batches.
        microbatches: Token lengths of every timed micro-batch.
        seconds: Median measured forward + backward seconds of each micro-batch.
        held_out: Boolean mask of the micro-batches left out of the fit.
        setup: How the timings were taken, as plain JSON values (:func:`calibrate` records the
            device, threads, model size and configuration, trials, repeats and elapsed
            seconds); empty when the caller timed the micro-batches itself.
    """

    time_model: TimeModel
    heldout: FitStats
    microbatches: list[np.ndarray]
    seconds: np.ndarray
    held_out: np.ndarray
    setup: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: the model, MAPE / R² / count on the fit and held-out sets, setup."""
        train = self.time_model.fit_stats
        assert train is not None, "TimeModel.fit always records its statistics"
        return {
            "time_model": json.loads(self.time_model.to_json()),
            "train": _stats_dict(train),
            "heldout": _stats_dict(self.heldout),
            **self.setup,
        }


def _stats_dict(stats: FitStats) -> dict[str, Any]:
    return {"mape": stats.mape, "r2": stats.r2, "n": stats.n_observations}


def model_config(size: str, *, max_position: int) -> ToyModelConfig:
    """The toy transformer's configuration of a named size.

    Args:
        size: A key of :data:`MODEL_SIZES`.
        max_position: Longest sample the model will see, in tokens.
    """
    from seqbalance.measure.toy_model import ToyModelConfig

    size = check_choice(size, "model_size", tuple(MODEL_SIZES))
    return ToyModelConfig(**MODEL_SIZES[size], max_position=max_position)


def check_seed(seed: int) -> int:
    """``seed`` checked: a whole number in ``[0, 2**64)``, the seeds torch's generators take
    (the toy model's weights; a larger one failed inside every bench rank).

    Raises:
        ValueError: naming ``seed``.
    """
    seed = check_int(seed, "seed", minimum=0)
    if seed >= 2**64:
        raise ValueError(f"seed must be below 2**64 (torch's generator seeds), got {seed}")
    return seed


def check_warmup(warmup: int) -> int:
    """``warmup`` checked: untimed runs, 0 to :data:`MAX_TIMED_RUNS` (``--warmup
    9223372036854775808`` was accepted and ran for ever: the bound on timed runs left them out).

    Raises:
        ValueError: naming ``warmup``.
    """
    warmup = check_int(warmup, "warmup", minimum=0)
    if warmup > MAX_TIMED_RUNS:
        raise ValueError(f"warmup must be at most {MAX_TIMED_RUNS} (2**20) runs, got {warmup}")
    return warmup


def check_timed_runs(trials: int, repeats: int) -> tuple[int, int]:
    """``(trials, repeats)`` checked: at least :data:`MIN_TRIALS` and 1, at most
    :data:`MAX_TIMED_RUNS` timed runs together.

    Raises:
        ValueError: naming the argument, or both when their product is too large.
    """
    trials = check_int(trials, "trials", minimum=MIN_TRIALS)
    repeats = check_int(repeats, "repeats", minimum=1)
    if trials * repeats > MAX_TIMED_RUNS:
        raise ValueError(
            f"trials x repeats = {trials} x {repeats} timed runs is more than {MAX_TIMED_RUNS} "
            "(2**20)"
        )
    return trials, repeats


def check_trials_per_rank(trials: int, world: int, name: str) -> None:
    """A context-parallel calibration's whole-sample plans give every rank one of the
    ``trials`` micro-batches each: fewer than the ``world`` ranks (called ``name``) made no
    such plan, the trials silently unused.

    Raises:
        ValueError: ``trials`` below ``world``, both named.
    """
    if trials < world:
        raise ValueError(
            f"trials must be >= {name} (each timed plan gives every rank one micro-batch), "
            f"got trials = {trials} with {name} = {world}"
        )


def check_model_memory(size: str, *, max_position: int, processes: int, name: str) -> None:
    """Refuse a toy model that cannot fit this machine's memory, before any is built.

    Each process holds the model's position table (``max_position x hidden_size`` float32) and
    its gradient: a lower bound of what a process needs, so a refusal is never wrong. (A run
    whose processes the machine could not hold would fail inside them, or wake the kernel's
    out-of-memory killer, which may pick any process.)

    Args:
        size: A key of :data:`MODEL_SIZES`.
        max_position: The model's position table, in tokens.
        processes: How many processes hold one model each on the CPU.
        name: What set ``max_position``, for the message (``"max_tokens"``).

    Raises:
        ValueError: naming ``name``, the table's size and the machine's memory.
    """
    config = model_config(size, max_position=max_position)
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not known on this platform: nothing to compare with
        return
    each = 2 * 4 * config.max_position * config.hidden_size
    if memory > 0 and processes * each > memory:
        gib = 2**30
        raise ValueError(
            f"{name} = {max_position} tokens: each of {processes} process(es) holds the toy "
            f"model's position table of {max_position} tokens and its gradient ({each / gib:.1f} "
            f"GiB), {processes * each / gib:.1f} GiB in all, more than this machine's "
            f"{memory / gib:.1f} GiB of memory"
        )


def calibration_microbatches(
    count: int, *, max_tokens: int, max_length: int, seed: int = 0, layout: str = "packed"
) -> list[np.ndarray]:
    """Token lengths of ``count`` varied micro-batches.

    Cycles through three compositions so the fit sees both terms vary independently: one sample
    (attention-heavy), 2-16 equal samples, and a lognormal mix. For the padded layout every
    sample of a micro-batch takes its longest one's length (what a padded micro-batch costs)
    and the count is cut to fit ``max_tokens``.

    Args:
        count: Number of micro-batches, at least :data:`MIN_TRIALS`.
        max_tokens: Most tokens in one micro-batch; each holds between ``max_tokens / 8`` and
            ``max_tokens`` (padded: at most ``max_tokens``, padding included).
        max_length: Longest single sample, in tokens.
        seed: Seed of the sizes and compositions.
        layout: ``"packed"`` or ``"padded"``.

    Returns:
        One int64 array of sample lengths (tokens) per micro-batch.
    """
    count = check_int(count, "trials", minimum=MIN_TRIALS)
    max_tokens = check_int(max_tokens, "max_tokens", minimum=8)
    max_length = check_int(max_length, "max_length", minimum=1)
    layout = check_choice(layout, "layout", LAYOUTS)
    rng = np.random.default_rng(seed)
    batches = []
    for index in range(count):
        budget = int(rng.integers(max_tokens // 8, max_tokens + 1))
        kind = index % 3
        if kind == 0:
            lengths = np.array([min(budget, max_length)])
        elif kind == 1:
            # At most max_tokens samples of at least 1 token: a cap under 16 holds them all.
            pieces = min(int(rng.integers(2, 17)), max_tokens)
            lengths = np.full(pieces, max(1, min(budget // pieces, max_length)))
        else:
            draws = rng.lognormal(np.log(max(budget / 6, 1.0)), 0.8, size=64)
            draws = np.clip(np.rint(draws), 1, max_length).astype(np.int64)
            lengths = draws[np.cumsum(draws) <= budget]
            if lengths.size == 0:
                lengths = draws[:1]
        if layout == "padded":
            longest = int(lengths.max())
            lengths = np.full(min(lengths.size, max(1, max_tokens // longest)), longest)
        batches.append(lengths.astype(np.int64))
    return batches


def costed_lengths(lengths: Any, layout: str) -> np.ndarray:
    """The sample lengths a TimeModel prices for a micro-batch of ``lengths`` (tokens): the
    samples themselves (packed), or every sample at the longest one's length (padded: the
    planner's ``count x cost(longest)``)."""
    lengths = as_lengths(lengths)
    if check_choice(layout, "layout", LAYOUTS) == "packed" or lengths.size == 0:
        return lengths
    return np.full(lengths.size, lengths.max())


def time_microbatches(
    model: TinyCausalTransformer,
    microbatches: Sequence[np.ndarray],
    *,
    device: torch.device,
    repeats: int = 3,
    warmup: int = 3,
    layout: str = "packed",
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Median seconds of forward + backward of ``model`` on each micro-batch.

    Inputs are built before timing; the largest micro-batch is run ``warmup`` times first
    (allocator, kernel selection, caches). Repeats sweep over all micro-batches in turn so
    slow drift of the machine spreads over every micro-batch instead of biasing a few.
    Gradients accumulate as in gradient accumulation and are cleared between sweeps.

    Args:
        model: The model to time, on ``device``.
        microbatches: Token lengths of the samples of each micro-batch.
        device: Where the inputs go.
        repeats: Timings per micro-batch; the median is kept.
        warmup: Untimed runs of the largest micro-batch first.
        layout: ``"packed"`` (:meth:`TinyCausalTransformer.forward` on THD batches) or
            ``"padded"`` (:meth:`TinyCausalTransformer.forward_padded`, every sample padded
            to the micro-batch's longest).
        progress: Called as ``progress(done, total)`` after each timed run.

    Returns:
        float64 seconds, one per micro-batch.
    """
    from seqbalance.measure.toy_model import make_packed_batch, make_padded_batch
    from seqbalance.runtime.collectives import synchronize

    repeats = check_int(repeats, "repeats", minimum=1)
    warmup = check_warmup(warmup)
    padded = check_choice(layout, "layout", LAYOUTS) == "padded"
    make = make_padded_batch if padded else make_packed_batch
    forward = model.forward_padded if padded else model
    vocab = model.config.vocab_size
    inputs = [
        tuple(t.to(device) for t in make(lengths, vocab_size=vocab, seed=index))
        for index, lengths in enumerate(microbatches)
    ]

    def run(batch: tuple[torch.Tensor, ...]) -> float:
        synchronize(device)
        start = time.perf_counter()
        forward(*batch).backward()
        synchronize(device)
        return time.perf_counter() - start

    largest = max(range(len(inputs)), key=lambda i: int(microbatches[i].sum()))
    for _ in range(warmup):
        run(inputs[largest])
    seconds = np.empty((repeats, len(inputs)))
    for sweep in range(repeats):
        model.zero_grad(set_to_none=False)
        for index, batch in enumerate(inputs):
            seconds[sweep, index] = run(batch)
            if progress is not None:
                progress(sweep * len(inputs) + index + 1, repeats * len(inputs))
    return np.median(seconds, axis=0)


def fit_time_model(microbatches: Sequence[np.ndarray], seconds: np.ndarray) -> Calibration:
    """Fit a TimeModel on all but every :data:`HOLDOUT_EVERY`-th micro-batch; score the rest.

    The fit minimises the relative error (``TimeModel.fit(..., relative=True)``).

    Args:
        microbatches: Token lengths of each timed micro-batch, at least :data:`MIN_TRIALS`.
        seconds: Measured seconds of each micro-batch, shape ``[len(microbatches)]``.

    Returns:
        The fitted model with its held-out statistics.

    Raises:
        ValueError: fewer than :data:`MIN_TRIALS` micro-batches, ``seconds`` of another shape,
            or a micro-batch or measurement that ``TimeModel.fit`` refuses.
    """
    check_int(len(microbatches), "number of micro-batches", minimum=MIN_TRIALS)
    seconds = np.asarray(seconds, dtype=np.float64)
    if seconds.shape != (len(microbatches),):  # one measurement per micro-batch, none spare
        raise ValueError(
            f"seconds must have shape ({len(microbatches)},), one per micro-batch, "
            f"got {seconds.shape}"
        )
    held_out = np.arange(len(microbatches)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    observations = [(microbatches[i], float(seconds[i])) for i in range(len(microbatches))]
    model = TimeModel.fit([observations[i] for i in np.flatnonzero(~held_out)], relative=True)
    return Calibration(
        time_model=model,
        heldout=model.score([observations[i] for i in np.flatnonzero(held_out)]),
        microbatches=list(microbatches),
        seconds=seconds,
        held_out=held_out,
    )


def resolve_device(name: str) -> torch.device:
    """``cpu``, or ``cuda`` as the current CUDA device; ValueError when CUDA is missing."""
    import torch

    name = check_choice(name, "device", ("cpu", "cuda"))
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda': this torch has no CUDA device available")
    return torch.device(name if name == "cpu" else f"cuda:{torch.cuda.current_device()}")


def calibrate(
    *,
    device: str = "cpu",
    model_size: str = "small",
    trials: int = 48,
    repeats: int = 3,
    warmup: int = 3,
    max_tokens: int = 4096,
    max_length: int | None = None,
    threads: int | None = 1,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Calibration:
    """Time the toy transformer on this device and fit a TimeModel (the whole calibration).

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        model_size: A key of :data:`MODEL_SIZES`.
        trials: Micro-batches to time, at least :data:`MIN_TRIALS`; every
            :data:`HOLDOUT_EVERY`-th is held out of the fit.
        repeats: Timings per micro-batch, the median kept.
        warmup: Untimed warm-up runs.
        max_tokens: Largest micro-batch, in tokens.
        max_length: Longest single sample, in tokens (default: ``max_tokens``).
        threads: torch CPU threads, set for the whole process (``torch.set_num_threads``;
            pinned to 1 by default for stable numbers, as the bench processes use); ``None``
            leaves torch's setting alone.
        seed: Seed of the micro-batch compositions and of the model's weights.
        progress: Called as ``progress(done, total)`` after each timed run.

    Returns:
        The fitted model, its held-out statistics, the timings and their ``setup``.

    Raises:
        ValueError: a bad argument, named; on the CPU, a ``max_length`` (``max_tokens``)
            whose toy model this machine's memory cannot hold (:func:`check_model_memory`).
    """
    import torch

    from seqbalance.measure.toy_model import TinyCausalTransformer

    started = time.perf_counter()
    trials, repeats = check_timed_runs(trials, repeats)
    warmup = check_warmup(warmup)
    seed = check_seed(seed)
    max_tokens = check_int(max_tokens, "max_tokens", minimum=8)
    max_length = (
        max_tokens if max_length is None else check_int(max_length, "max_length", minimum=1)
    )
    torch_device = resolve_device(device)
    config = model_config(model_size, max_position=max_length)
    if torch_device.type == "cpu":
        name = "max_tokens" if max_length == max_tokens else "max_length"
        check_model_memory(model_size, max_position=max_length, processes=1, name=name)
    if threads is not None:
        threads = check_int(threads, "threads", minimum=1)
        if threads > (os.cpu_count() or 1):
            raise ValueError(
                f"threads must be at most this machine's {os.cpu_count()} CPUs, got {threads}"
            )
        torch.set_num_threads(threads)
    microbatches = calibration_microbatches(
        trials, max_tokens=max_tokens, max_length=max_length, seed=seed
    )
    model = TinyCausalTransformer(config, seed=seed).to(torch_device)
    seconds = time_microbatches(
        model,
        microbatches,
        device=torch_device,
        repeats=repeats,
        warmup=warmup,
        progress=progress,
    )
    calibration = fit_time_model(microbatches, seconds)
    setup = {
        "device": str(torch_device),
        "threads": torch.get_num_threads(),
        "model_size": model_size,
        "model_config": model.config_dict(),
        "trials": len(microbatches),
        "repeats": repeats,
        "elapsed_seconds": time.perf_counter() - started,
    }
    return replace(calibration, setup=setup)


# ---------------------------------------------------------------------- processes
def available_cores() -> tuple[int, ...]:
    """The CPU cores this process may run on (``(0,)`` where the OS does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return (0,)


def pin_process(rank: int, cores: Sequence[int]) -> None:
    """Pin this process to ``cores[rank % len(cores)]`` with one torch thread, as every timed
    rank of ``bench`` and ``calibrate --context-parallel`` runs (stable timings, no
    oversubscription)."""
    import torch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
