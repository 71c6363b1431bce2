"""What a bench run does (:class:`BenchSettings`) and how real lengths are scaled to the toy."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from seqbalance._validation import (
    as_group_ids,
    as_lengths,
    check_choice,
    check_int,
    check_positive_float,
)
from seqbalance.cost import TimeModel
from seqbalance.plan import OBJECTIVES
from seqbalance.runtime.calibrate import MIN_TRIALS, MODEL_SIZES

__all__ = ["DEFAULT_STRATEGIES", "BenchSettings", "length_divisor", "scale_lengths"]

DEFAULT_STRATEGIES = ("round_robin", "token_kk", "balanced")
"""The common practice (round robin, token-sum Karmarkar–Karp) and ours."""

DEVICES = ("cpu", "cuda")


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
    lengths: Any, max_tokens: int, divisor: int | None = None
) -> tuple[np.ndarray, int]:
    """Real lengths scaled for the toy model: divided (rounded up), then cut to the cap.

    Args:
        lengths: Token lengths of the dataset.
        max_tokens: Token cap of a micro-batch; longer samples are truncated to it.
        divisor: Divide every length by this; default :func:`length_divisor`.

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
    return np.minimum(-(-lengths // divisor), max_tokens), divisor


def _this_process_cores() -> tuple[int, ...]:
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return (0,)


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """Everything a bench run needs; validated at construction (ValueError naming the field).

    Attributes:
        lengths: Token lengths to sample global batches from (already scaled, see
            :func:`scale_lengths`).
        groups: Group id per sample (kept on one rank), or None.
        procs: Training processes (data-parallel ranks).
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, one GPU per process).
        cores: CPU cores the processes are pinned to, rank r on ``cores[r % len(cores)]``;
            default: the cores this process may run on.
        strategies: Registered strategy names to measure, in turn.
        objective: ``"step"`` (DDP: one gradient all-reduce per step) or ``"lockstep"`` (one
            per micro-batch).
        global_batch_size: Samples per optimizer step (rounded up to whole groups).
        steps: Measured steps per strategy.
        warmup: Unmeasured steps per strategy first.
        max_tokens: Token cap of a packed micro-batch.
        model_size: Toy transformer size (a key of ``calibrate.MODEL_SIZES``).
        time_model: TimeModel to plan with; None calibrates one in the processes first.
        trials: Calibration micro-batches (at least ``calibrate.MIN_TRIALS``).
        repeats: Timings per calibration micro-batch (median kept).
        seed: Seed of the batch sampling, the planner and the model's weights.
        timeout_seconds: Seconds any collective may wait before the run fails.
        launch_timeout_seconds: Seconds the whole run may take before it is stopped.
    """

    lengths: tuple[int, ...]
    groups: tuple[int, ...] | None = None
    procs: int = 2
    device: str = "cpu"
    cores: tuple[int, ...] | None = None
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    objective: str = "step"
    global_batch_size: int = 32
    steps: int = 20
    warmup: int = 3
    max_tokens: int = 4096
    model_size: str = "small"
    time_model: TimeModel | None = None
    trials: int = 48
    repeats: int = 3
    seed: int = 0
    timeout_seconds: float = 300.0
    launch_timeout_seconds: float = 3600.0

    def __post_init__(self) -> None:
        def set_(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        lengths = as_lengths(self.lengths)
        if lengths.size == 0:
            raise ValueError("lengths must hold at least one sample, got none")
        set_("lengths", tuple(lengths.tolist()))
        if self.groups is not None:
            set_("groups", tuple(as_group_ids(self.groups, lengths.size).tolist()))
        set_("procs", check_int(self.procs, "procs", minimum=1))
        set_("device", check_choice(self.device, "device", DEVICES))
        cores = _this_process_cores() if self.cores is None else tuple(self.cores)
        if not cores:
            raise ValueError("cores must name at least one CPU core, got none")
        set_("cores", tuple(check_int(core, "cores", minimum=0) for core in cores))
        if isinstance(self.strategies, str) or not self.strategies:
            raise ValueError(
                f"strategies must be a non-empty sequence of names, got {self.strategies!r}"
            )
        set_("strategies", tuple(self.strategies))
        set_("objective", check_choice(self.objective, "objective", OBJECTIVES))
        for name, minimum in (
            ("global_batch_size", 1),
            ("steps", 1),
            ("warmup", 0),
            ("max_tokens", 8),
            ("trials", MIN_TRIALS),
            ("repeats", 1),
            ("seed", 0),
        ):
            set_(name, check_int(getattr(self, name), name, minimum=minimum))
        set_("model_size", check_choice(self.model_size, "model_size", tuple(MODEL_SIZES)))
        if self.time_model is not None and not isinstance(self.time_model, TimeModel):
            raise ValueError(f"time_model must be a TimeModel or None, got {self.time_model!r}")
        for name in ("timeout_seconds", "launch_timeout_seconds"):
            set_(name, check_positive_float(getattr(self, name), name))

    def describe(self) -> dict[str, Any]:
        """The settings as plain JSON values, without the data (lengths, groups, time model)."""
        return {
            field.name: getattr(self, field.name)
            for field in fields(self)
            if field.name not in ("lengths", "groups", "time_model")
        }
