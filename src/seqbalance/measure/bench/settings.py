"""What a bench run does (:class:`BenchSettings`) and how real lengths are scaled to the toy."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from seqbalance._deprecated import moved_names, renamed_fields
from seqbalance._validation import (
    MAX_TOKENS_LIMIT,
    as_group_ids,
    as_lengths,
    check_bool,
    check_choice,
    check_int,
    check_non_negative_float,
    check_positive_float,
    check_timeout,
)
from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.measure.calibrate import (
    MODEL_SIZES,
    available_cores,
    check_model_memory,
    check_seed,
    check_timed_runs,
    check_trials_per_rank,
)
from seqbalance.measure.hf_model import scaled_preset
from seqbalance.plan import ContextParallel, PlanOptions, strategy_names
from seqbalance.plan.options import check_rank_speeds

__all__ = [
    "DEFAULT_STRATEGIES",
    "MAX_NOISE",
    "MAX_SAMPLE_STEPS",
    "MAX_SLOWDOWN",
    "ONLINE_STRATEGIES",
    "TOY_MAX_TOKENS",
    "BenchSettings",
    "SlowRank",
    "length_divisor",
    "scale_lengths",
]

DEFAULT_STRATEGIES = ("round_robin", "token_kk", "balanced")
"""The common practice (round robin, token-sum Karmarkar–Karp) and ours."""
TOY_MAX_TOKENS = 4096
"""Token cap of a toy micro-batch unless the options say otherwise (a CPU core's worth; the
simulator's default for real models is ``seqbalance.sim.DEFAULT_MAX_TOKENS``)."""

__getattr__ = moved_names(__name__, {"DEFAULT_MAX_TOKENS": f"{__name__}.TOY_MAX_TOKENS"})

ONLINE_STRATEGIES = ("balanced_adaptive", "balanced_oracle")
"""Planned inside the processes step by step: ``balanced_adaptive`` with the closed loop
(``seqbalance.runtime.Adaptive``, starting from the run's time model), and
``balanced_oracle``, ``balanced`` given each step's true rank speeds (from ``slow_rank``)."""

DEVICES = ("cpu", "cuda")

MAX_SLOWDOWN = 100.0
"""The largest ``SlowRank.factor``: a rank slower than that has failed rather than slowed, and
its extra work would stretch the run as many times."""
MAX_NOISE = 10.0
"""The largest ``BenchSettings.noise`` (mean extra work per micro-batch, in its own times)."""
MAX_SAMPLE_STEPS = 2**24
"""The most samples a run trains per strategy, ``(warmup + steps) x global_batch_size``: at a
millisecond per sample on a CPU core that is already past the default launch timeout."""


@dataclass(frozen=True)
class SlowRank:
    """Rank ``rank`` computes ``factor`` times slower in measured steps ``[start, stop)``.

    The slowdown is real work: after each micro-batch the rank computes for ``factor - 1``
    times that micro-batch's measured time (as a slower device would), never a sleep.

    Attributes:
        rank: The slow rank.
        factor: How many times slower (1 to ``MAX_SLOWDOWN``).
        start: First slow measured step (warm-up steps are before 0).
        stop: First step after the slow spell, or None (to the end).
    """

    rank: int
    factor: float
    start: int = 0
    stop: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", check_int(self.rank, "slow_rank rank", minimum=0))
        factor = check_positive_float(self.factor, "slow_rank factor")
        if not 1 <= factor <= MAX_SLOWDOWN:
            raise ValueError(
                f"slow_rank factor must be between 1 and {MAX_SLOWDOWN:g}, got {self.factor!r}"
            )
        object.__setattr__(self, "factor", factor)
        object.__setattr__(self, "start", check_int(self.start, "slow_rank start", minimum=0))
        if self.stop is not None:
            stop = check_int(self.stop, "slow_rank stop", minimum=self.start + 1)
            object.__setattr__(self, "stop", stop)

    @classmethod
    def parse(cls, text: str) -> SlowRank:
        """``R:F``, ``R:F@START-STOP`` or ``R:F@START-`` (to the end): ``R``, ``START`` and
        ``STOP`` plain digits, ``F`` a decimal number. Any other form is refused, not guessed
        (``@5`` could be step 5 alone or from step 5; ``1_5`` a typo of 1.5 read as 15).

        Raises:
            ValueError: naming ``text`` when it has another form or bad values.
        """
        text = str(text)
        head, at, spell = text.strip().partition("@")
        rank, colon, factor = head.partition(":")
        start, dash, stop = spell.partition("-")
        problem = None
        if not colon or ":" in factor:
            problem = "expected one ':' between R and F"
        elif at and not dash:
            problem = f"the spell {spell!r} must be START-STOP or START- (to the end)"
        else:
            whole = [("rank", rank)] + ([("START", start), ("STOP", stop)] if at else [])
            for name, value in whole:
                if name == "STOP" and not value:
                    continue  # START-: to the end
                if not (value.isascii() and value.isdigit()):
                    problem = f"{name} {value!r} must be a whole number in plain digits"
                    break
            if problem is None and (not factor or "_" in factor or factor != factor.strip()):
                problem = f"factor {factor!r} must be a decimal number"
        if problem is None:
            try:
                values = (int(rank), float(factor), int(start or 0), int(stop) if stop else None)
            except ValueError as error:
                problem = str(error)
        if problem is not None:
            raise ValueError(f"slow_rank must be R:F or R:F@START-STOP, got {text!r}: {problem}")
        return cls(*values)

    def factor_at(self, step: int) -> float:
        """The slowdown of measured step ``step`` (1.0 outside the slow spell)."""
        inside = step >= self.start and (self.stop is None or step < self.stop)
        return self.factor if inside else 1.0

    def speeds(self, procs: int, step: int) -> tuple[float, ...] | None:
        """True relative speeds of the ranks at ``step``, or None when all are equal."""
        factor = self.factor_at(step)
        if factor == 1.0:
            return None
        return tuple(1.0 / factor if r == self.rank else 1.0 for r in range(procs))


def length_divisor(lengths: Any, max_tokens: int) -> int:
    """Smallest integer that brings the median sample to at most a quarter of the token cap.

    Keeps several samples per micro-batch, so placement (not truncation) decides step time.

    Args:
        lengths: Token lengths of the dataset.
        max_tokens: Token cap of a micro-batch.
    """
    lengths = as_lengths(lengths)
    max_tokens = check_int(max_tokens, "max_tokens", minimum=8)
    median = float(np.median(lengths)) if lengths.size else 0.0
    return max(1, math.ceil(median / (max_tokens / 4)))


def scale_lengths(
    lengths: Any, max_tokens: int, divisor: int | None = None, *, truncate: bool = True
) -> tuple[np.ndarray, int]:
    """Real lengths scaled for the toy model: divided (rounded up), then cut to ``max_tokens``.

    Args:
        lengths: Token lengths of the dataset.
        max_tokens: Longest sample kept: longer samples are truncated to it (the token cap of
            a micro-batch; with context parallelism, the largest CP size times the per-rank
            cap).
        divisor: Divide every length by this (at most 2**53); default
            :func:`length_divisor` of ``max_tokens``.
        truncate: False keeps samples longer than ``max_tokens`` whole (``allow_oversize``:
            the planner gives each a micro-batch of its own).

    Returns:
        ``(scaled int64 lengths, divisor used)``.
    """
    lengths = as_lengths(lengths)
    max_tokens = check_int(max_tokens, "max_tokens", minimum=8)
    divisor = (
        length_divisor(lengths, max_tokens)
        if divisor is None
        else check_int(divisor, "length_divisor", minimum=1)
    )
    if divisor > MAX_TOKENS_LIMIT:  # int64 lengths // 2**63 raised OverflowError, naming nothing
        raise ValueError(f"length_divisor must be <= 2**53 = {MAX_TOKENS_LIMIT}, got {divisor}")
    scaled = -(-lengths // divisor)
    return (np.minimum(scaled, max_tokens) if check_bool(truncate, "truncate") else scaled), divisor


@renamed_fields(timeout_seconds="timeout", launch_timeout_seconds="launch_timeout")
@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """Everything a bench run needs; validated at construction (ValueError naming the field;
    on the CPU also sizes whose toy models the machine's memory cannot hold,
    :func:`~seqbalance.measure.calibrate.check_model_memory`).

    Attributes:
        lengths: Token lengths to sample global batches from (already scaled, see
            :func:`scale_lengths`).
        groups: Group id per sample (kept on one rank), or None.
        procs: Training processes (data-parallel ranks; with ``context_parallel``, the ranks
            of the DPxCP domain).
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, one GPU per process; not with
            ``context_parallel``, whose calibration times gloo collectives on the CPU).
        cores: CPU cores the processes are pinned to, rank r on ``cores[r % len(cores)]``;
            default: the cores this process may run on.
        strategies: Strategy names to measure, in turn; None: :data:`DEFAULT_STRATEGIES`, or
            every context-parallel strategy (``strategy_names(context_parallel=True)``) with
            ``context_parallel``.
        options: The plan options every strategy plans with, the same object ``plan_step`` and
            ``simulate`` take (``PlanOptions``: ``max_tokens`` (required), ``layout`` /
            ``microbatch_size``, micro-batch counts, ``objective``, ``order``,
            ``allow_oversize``, ``allow_empty``, ``context_parallel``). Their ``cost`` is the
            run's time model and their ``strategy`` each of ``strategies`` in turn, so both
            must be left at their defaults; with ``context_parallel`` (CP sizes and scheme, to
            shard long samples over context-parallel groups of the processes; ``max_tokens`` is
            then the per-rank cap) the cost must name seconds, as every context-parallel request
            does: ``cost="flops"``, which the run's ``ContextParallelTimeModel`` replaces.
            ``context_parallel.comm`` must be None (the run calibrates it, or takes it from
            ``time_model``).
        global_batch_size: Samples per optimizer step (rounded up to whole groups).
        steps: Measured steps per strategy.
        warmup: Unmeasured steps per strategy first.
        model_size: Toy transformer size (a key of ``calibrate.MODEL_SIZES``).
        hf_model: With ``context_parallel``: a bundled preset whose architecture is measured
            too, after the toy, as a small Hugging Face causal LM
            (``seqbalance.measure.hf_model.scaled_preset``; needs ``transformers``); None: the
            toy only.
        time_model: What to plan with: a TimeModel (a ``ContextParallelTimeModel`` with
            ``context_parallel``); None calibrates one in the processes first.
        trials: Calibration micro-batches (at least ``calibrate.MIN_TRIALS``).
        repeats: Timings per calibration micro-batch (median kept).
        seed: Seed of the batch sampling, the planner and the model's weights.
        slow_rank: A :class:`SlowRank` that computes slower (real extra work), or None.
        noise: Background load on every rank, reproducible: after each micro-batch a rank
            computes again for a random multiple of its time, exponentially distributed with
            mean ``noise`` (0 to ``MAX_NOISE``; drawn from ``seed``, the rank, the step and
            the micro-batch), as a neighbour stealing time slices would. 0: none.
        timeout: Seconds any collective may wait before the run fails (was
            ``timeout_seconds``, deprecated for one release).
        launch_timeout: Seconds the whole run may take before it is stopped (was
            ``launch_timeout_seconds``, deprecated for one release).
    """

    lengths: tuple[int, ...]
    groups: tuple[int, ...] | None = None
    procs: int = 2
    device: str = "cpu"
    cores: tuple[int, ...] | None = None
    strategies: tuple[str, ...] | None = None
    options: PlanOptions = field(default_factory=lambda: PlanOptions(max_tokens=TOY_MAX_TOKENS))
    global_batch_size: int = 32
    steps: int = 20
    warmup: int = 3
    model_size: str = "small"
    hf_model: str | None = None
    time_model: TimeModel | ContextParallelTimeModel | None = None
    trials: int = 48
    repeats: int = 3
    seed: int = 0
    slow_rank: SlowRank | None = None
    noise: float = 0.0
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    launch_timeout: float = 3600.0

    def __post_init__(self) -> None:
        def set_(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        lengths = as_lengths(self.lengths)
        if lengths.size == 0:
            raise ValueError("lengths must hold at least one sample, got none")
        if not lengths.any():  # the ranks' calibration would find nothing to time, after launch
            raise ValueError(f"lengths: every sample has 0 tokens ({lengths.size} samples)")
        set_("lengths", tuple(lengths.tolist()))
        if self.groups is not None:
            set_("groups", tuple(as_group_ids(self.groups, lengths.size).tolist()))
        set_("procs", check_int(self.procs, "procs", minimum=1))
        set_("device", check_choice(self.device, "device", DEVICES))
        cores = available_cores() if self.cores is None else tuple(self.cores)
        if not cores:
            raise ValueError("cores must name at least one CPU core, got none")
        set_("cores", tuple(check_int(core, "cores", minimum=0) for core in cores))
        for name, minimum in (
            ("global_batch_size", 1),
            ("steps", 1),
            ("warmup", 0),
        ):
            set_(name, check_int(getattr(self, name), name, minimum=minimum))
        set_("seed", check_seed(self.seed))
        trials, repeats = check_timed_runs(self.trials, self.repeats)
        set_("trials", trials)
        set_("repeats", repeats)
        set_("model_size", check_choice(self.model_size, "model_size", tuple(MODEL_SIZES)))
        if (self.warmup + self.steps) * self.global_batch_size > MAX_SAMPLE_STEPS:
            raise ValueError(
                f"(warmup + steps) x global_batch_size must be at most {MAX_SAMPLE_STEPS} "
                f"samples per strategy, got ({self.warmup} + {self.steps}) x "
                f"{self.global_batch_size}"
            )
        noise = check_non_negative_float(self.noise, "noise")
        if noise > MAX_NOISE:
            raise ValueError(f"noise must be between 0 and {MAX_NOISE:g}, got {self.noise!r}")
        set_("noise", noise)
        for name in ("timeout", "launch_timeout"):
            set_(name, check_timeout(getattr(self, name), name))
        if isinstance(self.strategies, str) or (
            self.strategies is not None and not self.strategies
        ):
            raise ValueError(
                f"strategies must be a non-empty sequence of names, got {self.strategies!r}"
            )
        self._check_options()
        self._check_speeds()
        self._check_hf_model()
        if self.context_parallel is None:
            self._check_data_parallel()
        else:
            self._check_context_parallel()

    def _check_options(self) -> None:
        options = self.options
        if not isinstance(options, PlanOptions):
            raise ValueError(f"options must be a PlanOptions, got {type(options).__name__}")
        run_model = "every strategy plans with the run's time model (time_model, or calibrated)"
        # With context_parallel the cost must name seconds: "flops" stands for the run's model.
        for name, default, why in (
            ("cost", "tokens" if options.context_parallel is None else "flops", run_model),
            ("model", None, run_model),
            ("strategy", "balanced", "the strategies are measured in turn (strategies=...)"),
        ):
            if getattr(options, name) != default:
                raise ValueError(f"options.{name} must be left at {default!r}: {why}")

    def _check_speeds(self) -> None:
        if self.slow_rank is not None:
            if not isinstance(self.slow_rank, SlowRank):
                raise ValueError(f"slow_rank must be a SlowRank or None, got {self.slow_rank!r}")
            if self.slow_rank.rank >= self.procs:
                raise ValueError(
                    f"slow_rank rank must be < procs = {self.procs}, got {self.slow_rank.rank}"
                )
            if self.slow_rank.start >= self.steps:
                # A spell after the last measured step slowed nothing: the run compared the
                # closed loop on equal ranks without a word.
                raise ValueError(
                    f"slow_rank start must be < steps = {self.steps}, got "
                    f"{self.slow_rank.start}: the spell would begin after the last measured "
                    "step, so no rank would be slowed"
                )
        speeds = self.options.rank_speeds
        if speeds is not None:
            check_rank_speeds(speeds, self.procs)
        if self.context_parallel is not None and self.slow_rank is not None:
            raise ValueError("slow_rank is not supported with context_parallel")
        if self.context_parallel is not None and self.noise:
            raise ValueError("noise is not supported with context_parallel")

    def _check_data_parallel(self) -> None:
        if self.options.max_tokens is None:
            raise ValueError("max_tokens must be set: the toy model trains capped micro-batches")
        if self.options.max_tokens < 8:
            raise ValueError(f"max_tokens must be >= 8, got {self.options.max_tokens}")
        if self.time_model is not None and not isinstance(self.time_model, TimeModel):
            raise ValueError(f"time_model must be a TimeModel or None, got {self.time_model!r}")
        longest = max(self.lengths)
        if longest > self.options.max_tokens and not self.options.allow_oversize:
            raise ValueError(
                f"lengths hold a sample of {longest} tokens, above max_tokens = "
                f"{self.options.max_tokens}: truncate the lengths (scale_lengths) or set "
                "allow_oversize=True"
            )
        strategies = DEFAULT_STRATEGIES if self.strategies is None else tuple(self.strategies)
        object.__setattr__(self, "strategies", strategies)
        if self.device == "cpu":
            name = "max_tokens" if self.max_position == self.options.max_tokens else "lengths"
            check_model_memory(
                self.model_size, max_position=self.max_position, processes=self.procs, name=name
            )

    def _check_hf_model(self) -> None:
        if self.hf_model is None:
            return
        if self.context_parallel is None:
            raise ValueError("hf_model is measured with context_parallel only")
        if importlib.util.find_spec("transformers") is None:
            raise ValueError(
                f"hf_model {self.hf_model!r} needs transformers: pip install 'seqbalance[hf]'"
            )
        scaled_preset(self.hf_model, max_position=1)  # an unknown or unsupported preset, named

    def _check_context_parallel(self) -> None:
        cp = self.context_parallel
        if cp.comm is not None:
            raise ValueError(
                "context_parallel.comm must be None: the run calibrates the communication "
                "(or takes it from time_model)"
            )
        if self.device != "cpu":
            raise ValueError(
                f"device {self.device!r} is not supported with context_parallel: its "
                "calibration times gloo collectives on the CPU"
            )
        usable = cp.usable_sizes(self.procs)
        if not usable:
            raise ValueError(
                f"context_parallel sizes {list(cp.sizes)}: none divides procs = {self.procs}"
            )
        if self.time_model is not None and not isinstance(
            self.time_model, ContextParallelTimeModel
        ):
            raise ValueError(
                "time_model must be a ContextParallelTimeModel or None with context_parallel, "
                f"got {type(self.time_model).__name__}"
            )
        if self.time_model is None or self.hf_model is not None:  # calibrated in the processes
            check_trials_per_rank(self.trials, self.procs, "procs")
        if (self.time_model is None or self.hf_model is not None) and usable[-1] == 1:
            # The processes fit a time model on sharded slots first, and the fit refuses this
            # in every process: refused here, before any process starts.
            raise ValueError(
                f"context_parallel sizes {list(cp.sizes)} hold no CP size > 1 that divides "
                f"procs = {self.procs}: the run calibrates its time model on sharded samples "
                "first (give a size > 1 that divides procs, or time_model without hf_model)"
            )
        names = strategy_names(context_parallel=True)
        strategies = names if self.strategies is None else tuple(self.strategies)
        for name in strategies:
            check_choice(name, "strategies entry (with context_parallel)", names)
        object.__setattr__(self, "strategies", strategies)
        # The options that context-parallel planning cannot honour fail here, named.
        self.context_parallel_options(
            ContextParallelTimeModel(TimeModel(0.0, 1.0, 0.0), CommModel(), 0, 0)
        )
        longest, cap = max(self.lengths), self.options.max_tokens
        if longest > usable[-1] * cap:
            raise ValueError(
                f"lengths hold a sample of {longest} tokens, above the largest CP size usable "
                f"on {self.procs} processes ({usable[-1]}) x max_tokens = {cap} (the per-rank cap)"
            )

    @property
    def context_parallel(self) -> ContextParallel | None:
        """``options.context_parallel`` (the per-rank cap is ``options.max_tokens``)."""
        return self.options.context_parallel

    def context_parallel_options(self, cost: ContextParallelTimeModel) -> PlanOptions:
        """The context-parallel plan options of a strategy: :attr:`options` with ``cost``
        (the run's time model, carrying the communication constants)."""
        if self.context_parallel is None:
            raise ValueError("context_parallel_options: these settings have no context_parallel")
        return self.options.replace(cost=cost)

    @property
    def max_position(self) -> int:
        """Longest sample the toy model sees (its position table), in tokens."""
        cap = self.options.max_tokens
        return max(max(self.lengths), 0 if cap is None else cap)

    def describe(self) -> dict[str, Any]:
        """The settings as plain JSON values, without the data (lengths, groups, time model);
        ``options`` as ``PlanOptions.to_dict()`` without ``cost``, ``model``, ``strategy`` and
        ``context_parallel``, which is given as ``ContextParallel.to_dict()`` (or None)."""
        described = {
            item.name: getattr(self, item.name)
            for item in fields(self)
            if item.name not in ("lengths", "groups", "time_model", "options", "slow_rank")
        }
        described["slow_rank"] = None if self.slow_rank is None else asdict(self.slow_rank)
        options = self.options.to_dict()
        for name in ("cost", "model", "strategy"):
            del options[name]
        options.pop("context_parallel", None)
        described["options"] = options
        described["context_parallel"] = (
            None if self.context_parallel is None else self.context_parallel.to_dict()
        )
        return described
