"""`seqbalance calibrate`: measure micro-batch times on this device and fit a TimeModel.

Times forward + backward of the toy causal transformer (``seqbalance.runtime.toy_model``) over
packed micro-batches of varied sizes and compositions (one long sample, many equal ones, a
lognormal mix), fits ``seconds = t0 + t1·ΣL + t2·ΣL²`` on three quarters of them (minimising the
relative error, since the figure that matters is the error per micro-batch whatever its size)
and reports the error on the held-out quarter. The functions here are reused by
``seqbalance bench``, whose processes calibrate under the same load they train under. torch is
imported inside functions.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import check_int
from seqbalance.cli._common import add_json_flag, print_json, print_table, progress_callback

if TYPE_CHECKING:
    import torch

    from seqbalance.cost import TimeModel
    from seqbalance.runtime.toy_model import ToyModelConfig

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
"""Every 4th measured micro-batch is held out of the fit to report honest errors."""


@dataclass(frozen=True)
class Calibration:
    """A fitted TimeModel and its errors (fractions, 0.05 = 5%) on held-out micro-batches.

    ``microbatches`` are the token lengths of every timed micro-batch and ``seconds`` their
    median measured forward + backward time; ``held_out`` marks those not used in the fit.
    """

    time_model: TimeModel
    heldout_mape: float
    heldout_r2: float
    microbatches: list[np.ndarray]
    seconds: np.ndarray
    held_out: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: coefficients, train and held-out errors, observation counts."""
        stats = self.time_model.fit_stats
        assert stats is not None, "TimeModel.fit always records its statistics"
        return {
            "time_model": json.loads(self.time_model.to_json()),
            "train": {"mape": stats.mape, "r2": stats.r2, "n": stats.n_observations},
            "heldout": {
                "mape": self.heldout_mape,
                "r2": self.heldout_r2,
                "n": int(self.held_out.sum()),
            },
        }


def model_config(size: str, *, max_position: int) -> ToyModelConfig:
    """The ``ToyModelConfig`` of a named size, with positions for samples up to ``max_position``."""
    from seqbalance.runtime.toy_model import ToyModelConfig

    if size not in MODEL_SIZES:
        raise ValueError(f"model size must be one of {', '.join(MODEL_SIZES)}, got {size!r}")
    return ToyModelConfig(**MODEL_SIZES[size], max_position=max_position)


def calibration_microbatches(
    count: int, *, max_tokens: int, max_length: int, seed: int = 0
) -> list[np.ndarray]:
    """Token lengths of ``count`` varied packed micro-batches of at most ``max_tokens`` tokens.

    Cycles through three compositions so the fit sees both terms vary independently: one sample
    (attention-heavy), 2–16 equal samples, and a lognormal mix; each sample is at most
    ``max_length`` tokens and each micro-batch holds between ``max_tokens / 8`` and
    ``max_tokens`` tokens.
    """
    count = check_int(count, "trials", minimum=3)
    max_tokens = check_int(max_tokens, "max_tokens", minimum=8)
    max_length = check_int(max_length, "max_length", minimum=1)
    rng = np.random.default_rng(seed)
    batches = []
    for index in range(count):
        budget = int(rng.integers(max_tokens // 8, max_tokens + 1))
        kind = index % 3
        if kind == 0:
            lengths = np.array([min(budget, max_length)])
        elif kind == 1:
            pieces = int(rng.integers(2, 17))
            lengths = np.full(pieces, max(1, min(budget // pieces, max_length)))
        else:
            draws = rng.lognormal(np.log(max(budget / 6, 1.0)), 0.8, size=64)
            draws = np.clip(np.rint(draws), 1, max_length).astype(np.int64)
            lengths = draws[np.cumsum(draws) <= budget]
            if lengths.size == 0:
                lengths = draws[:1]
        batches.append(lengths.astype(np.int64))
    return batches


def _synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_microbatches(
    model: torch.nn.Module,
    microbatches: Sequence[np.ndarray],
    *,
    device: torch.device,
    repeats: int = 3,
    warmup: int = 3,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Median seconds of forward + backward of ``model`` on each packed micro-batch.

    Inputs are built before timing; the largest micro-batch is run ``warmup`` times first
    (allocator, kernel selection, caches). Repeats sweep over all micro-batches in turn so
    slow drift of the machine spreads over every micro-batch instead of biasing a few.
    Gradients accumulate as in gradient accumulation and are cleared between sweeps.
    """
    from seqbalance.runtime.toy_model import make_packed_batch

    vocab = model.config.vocab_size
    inputs = [
        tuple(t.to(device) for t in make_packed_batch(lengths, vocab_size=vocab, seed=index))
        for index, lengths in enumerate(microbatches)
    ]

    def run(batch: tuple[torch.Tensor, ...]) -> float:
        _synchronize(device)
        start = time.perf_counter()
        model(*batch).backward()
        _synchronize(device)
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
    """Fit a TimeModel on all but every ``HOLDOUT_EVERY``-th micro-batch; score the rest."""
    from seqbalance.cost import TimeModel

    held_out = np.arange(len(microbatches)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    train = [(microbatches[i], float(seconds[i])) for i in np.flatnonzero(~held_out)]
    model = TimeModel.fit(train, relative=True)
    test = np.flatnonzero(held_out)
    predicted = np.array([model.microbatch_seconds(microbatches[i]) for i in test])
    measured = seconds[test]
    spread = float(np.sum((measured - measured.mean()) ** 2)) if test.size else 0.0
    residual = float(np.sum((measured - predicted) ** 2))
    return Calibration(
        time_model=model,
        heldout_mape=float(np.mean(np.abs(predicted - measured) / measured)) if test.size else 0.0,
        heldout_r2=1.0 - residual / spread if spread > 0 else 1.0,
        microbatches=list(microbatches),
        seconds=np.asarray(seconds, dtype=np.float64),
        held_out=held_out,
    )


def resolve_device(name: str) -> torch.device:
    """``cpu`` or ``cuda`` (the current CUDA device); a clear error when CUDA is missing."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this torch has no CUDA device available")
    return torch.device(name if name == "cpu" else f"cuda:{torch.cuda.current_device()}")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure micro-batch times of a small transformer here and fit a TimeModel (torch)",
        description=(
            "Time forward + backward of a small causal transformer on packed micro-batches of "
            "varied lengths on this device, fit seconds = t0 + t1*sum(L) + t2*sum(L^2) "
            "(least relative error), print "
            "its error on held-out micro-batches and write it as JSON for --time-model."
        ),
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default: cpu")
    parser.add_argument(
        "--model-size", choices=tuple(MODEL_SIZES), default="small", help="default: small"
    )
    parser.add_argument(
        "--trials", type=int, default=48, help="micro-batches to time (default: 48)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timings per micro-batch, median kept (default: 3)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="warm-up runs (default: 3)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="largest micro-batch in tokens (default: 4096)",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="longest single sample in tokens (default: --max-tokens)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads, pinned for stable numbers (default: 1, as `bench` uses)",
    )
    parser.add_argument("--seed", type=int, default=0, help="micro-batch composition seed")
    parser.add_argument(
        "-o", "--output", metavar="FILE", default="time_model.json", help="default: %(default)s"
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from seqbalance.runtime.toy_model import TinyCausalTransformer

    threads = check_int(args.threads, "--threads", minimum=1)
    repeats = check_int(args.repeats, "--repeats", minimum=1)
    warmup = check_int(args.warmup, "--warmup", minimum=0)
    max_length = args.max_tokens if args.max_length is None else args.max_length
    microbatches = calibration_microbatches(
        args.trials, max_tokens=args.max_tokens, max_length=max_length, seed=args.seed
    )
    device = resolve_device(args.device)
    torch.set_num_threads(threads)
    config = model_config(args.model_size, max_position=max(max_length, 1))
    model = TinyCausalTransformer(config, seed=args.seed).to(device)
    started = time.perf_counter()
    with progress_callback("timing micro-batches", enabled=not args.json) as callback:
        seconds = time_microbatches(
            model, microbatches, device=device, repeats=repeats, warmup=warmup, progress=callback
        )
    calibration = fit_time_model(microbatches, seconds)
    calibration.time_model.save(args.output)
    report = {
        **calibration.to_dict(),
        "device": str(device),
        "threads": threads,
        "model_size": args.model_size,
        "model_config": model.config_dict(),
        "trials": len(microbatches),
        "repeats": repeats,
        "elapsed_seconds": time.perf_counter() - started,
        "output": str(Path(args.output)),
    }
    if args.json:
        print_json(report)
        return 0
    model_fit = calibration.time_model
    train = report["train"]
    print_table(
        f"TimeModel for the {args.model_size} toy transformer on {device} ({threads} thread(s))",
        ("", "value"),
        [
            ("t0 (ms per micro-batch)", f"{1e3 * model_fit.t0:.3f}"),
            ("t1 (µs per token)", f"{1e6 * model_fit.t1:.3f}"),
            ("t2 (ns per token²)", f"{1e9 * model_fit.t2:.4f}"),
            ("fit MAPE / R²", f"{100 * train['mape']:.1f}% / {train['r2']:.4f}"),
            (
                "held-out MAPE / R²",
                f"{100 * calibration.heldout_mape:.1f}% / {calibration.heldout_r2:.4f}",
            ),
            ("micro-batches (fit + held-out)", f"{train['n']} + {report['heldout']['n']}"),
        ],
        caption=f"{report['elapsed_seconds']:.1f} s; written to {args.output}",
    )
    return 0
