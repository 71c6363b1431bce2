"""Helpers shared by the subcommands: common inputs and flags, and (re-exported from
``cli/_output.py``, their home) tables, JSON and progress bars.

The input helpers turn the arguments several commands share (a lengths file or bundled set, a
model preset or ``config.json``, a time model) into objects, raising ValueError with the
argument's name.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance import datasets
from seqbalance._deprecated import message
from seqbalance._validation import as_lengths, check_positive_float, not_a_file
from seqbalance.cli._lengths_file import read_lengths_file
from seqbalance.cli._output import (
    markdown_table,
    print_json,
    print_section,
    print_table,
    progress,
    progress_callback,
    to_jsonable,
    write_output,
)
from seqbalance.cost import TimeModel, resolve_cost, seconds_model
from seqbalance.cost import resolve_model as _resolve_model
from seqbalance.cost.context_parallel import ContextParallelTimeModel, load_time_model_file
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_MODEL, DEFAULT_PEAK_FLOPS_PER_S
from seqbalance.plan import LAYOUTS, OBJECTIVES, ORDERS, ContextParallel, PlanOptions, option_names

if TYPE_CHECKING:
    from seqbalance.cost import HSTUFlopsModel, ModelSpec

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_LENGTHS",
    "DEFAULT_PEAK_TFLOPS",
    "STEP_FLAGS",
    "LengthsInput",
    "add_context_parallel_arguments",
    "add_json_flag",
    "add_lengths_option",
    "add_objective_argument",
    "add_plan_option_arguments",
    "add_strategies_option",
    "add_time_model_arguments",
    "context_parallel_cost_from_args",
    "context_parallel_from_args",
    "cost_from_args",
    "describe_time_model",
    "flag",
    "flag_names",
    "load_lengths",
    "load_time_model",
    "markdown_table",
    "plan_options_from_args",
    "print_json",
    "print_section",
    "print_table",
    "progress",
    "progress_callback",
    "require_torch",
    "resolve_model",
    "time_model_from_args",
    "to_jsonable",
    "with_kv_sizes",
    "write_output",
]

DEFAULT_PEAK_TFLOPS = DEFAULT_PEAK_FLOPS_PER_S / 1e12
"""``seqbalance.defaults.DEFAULT_PEAK_FLOPS_PER_S`` in the CLI's unit, TFLOP/s."""
MIN_TFLOPS = 1e-12
"""Least ``--peak-tflops x --efficiency`` accepted: 1 FLOP/s."""
LONG_CONTEXT = "long_context"
"""``--lengths long_context``: the generated long-context mix (``datasets.long_context``)."""
LONG_CONTEXT_SAMPLES = 20_000
DEFAULT_LENGTHS = "sharegpt"
"""Bundled dataset that simulate and bench sample from when ``--lengths`` is not given."""


def add_json_flag(parser: argparse.ArgumentParser, *, markdown: str | None = None) -> None:
    """Add the ``--json`` flag every reporting command shares; with ``markdown`` (what the
    command prints, e.g. "the table"), ``--markdown`` too, the two refused together (one usage
    line, rc 2: ``--json`` alone was printed, the markdown asked for dropped without a word)."""
    group: Any = parser
    if markdown is not None:
        group = parser.add_mutually_exclusive_group()
        group.add_argument(
            "--markdown", action="store_true", help=f"print {markdown} as a markdown section"
        )
    group.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON on stdout instead of a table",
    )


def add_objective_argument(parser: Any) -> None:
    """Add ``--objective``, the planner objective shared by plan, simulate and bench."""
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="step",
        help="step: DDP, ranks sync once per step; lockstep: FSDP/ZeRO-3, sync per micro-batch",
    )


def add_lengths_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--lengths`` (read it with :func:`load_lengths`), shared by simulate and bench."""
    parser.add_argument(
        "--lengths",
        default=DEFAULT_LENGTHS,
        metavar="NAME|FILE.npy",
        help=f"bundled dataset (see `seqbalance datasets`), {LONG_CONTEXT} (generated: 10%% of "
        f"samples 32k-128k tokens, the rest around 2k) or .npy of token lengths (default: "
        f"{DEFAULT_LENGTHS}); bundled groups (qwen25math) are kept together",
    )


def _comma_separated(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def add_strategies_option(
    parser: argparse.ArgumentParser,
    default: Sequence[str],
    *,
    context_parallel_default: Sequence[str] | None = None,
) -> None:
    """Add ``--strategies``, parsed into a tuple of names, shared by simulate and bench.

    With ``context_parallel_default`` the flag defaults to None (the command picks ``default``
    or, with ``--context-parallel``, ``context_parallel_default``)."""
    listed = ",".join(default)
    if context_parallel_default is None:
        parser.add_argument(
            "--strategies",
            type=_comma_separated,
            default=listed,
            help=f"comma-separated strategies to compare (default: {listed})",
        )
        return
    parser.add_argument(
        "--strategies",
        type=_comma_separated,
        default=None,
        help=f"comma-separated strategies to compare (default: {listed}; with "
        f"--context-parallel: {','.join(context_parallel_default)})",
    )


@dataclass(frozen=True)
class LengthsInput:
    """Token lengths read from a file or a bundled dataset, with group ids when it has them."""

    lengths: np.ndarray
    groups: np.ndarray | None
    label: str


def load_lengths(source: str, *, argument: str = "--lengths") -> LengthsInput:
    """Read ``source``: a ``.npy`` file of token lengths, or the name of a bundled dataset.

    Raises ValueError naming ``argument`` when the file cannot be read, holds anything but
    non-negative integers (the message names the first bad sample), or the name is unknown.
    """
    if not source.strip():  # Path("") is ".", the current folder: "no such file '.'"
        raise ValueError(f"{argument} is empty: give a .npy file or a bundled dataset's name")
    path = Path(source)
    named = source == LONG_CONTEXT or source in datasets.names()
    # A folder of the same name (a downloaded copy of the dataset) does not hide a bundled set.
    if path.suffix == ".npy" or path.is_file() or (path.exists() and not named):
        return LengthsInput(read_lengths_file(path, argument), None, path.name)

    if source == LONG_CONTEXT:
        return LengthsInput(datasets.long_context(LONG_CONTEXT_SAMPLES), None, LONG_CONTEXT)
    available = datasets.names()
    if source not in available:
        raise ValueError(
            f"{argument} {source!r} is neither a file nor a bundled dataset "
            f"(bundled: {', '.join(available)}; generated: {LONG_CONTEXT})"
        )
    lengths = as_lengths(datasets.load(source), source)
    groups = datasets.groups(source)
    return LengthsInput(lengths, None if groups is None else as_lengths(groups), source)


def resolve_model(source: str) -> ModelSpec | HSTUFlopsModel:
    """``--model``: a preset name, a Hugging Face ``config.json`` path, or a folder holding one
    (``seqbalance.cost.resolve_model``)."""
    return _resolve_model(source, "--model")


def add_time_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--model``, ``--peak-tflops``, ``--efficiency`` and ``--time-model``."""
    group = parser.add_argument_group(
        "cost model",
        "Predicted seconds per micro-batch: the model's FLOPs at peak x efficiency, or a "
        "TimeModel measured by `seqbalance calibrate`.",
    )
    group.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model preset (see `seqbalance models`) or HF config.json path (default: "
        f"{DEFAULT_MODEL})",
    )
    group.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help=f"accelerator peak in TFLOP/s (default: {DEFAULT_PEAK_TFLOPS:g}, H100 bf16 dense)",
    )
    group.add_argument(
        "--efficiency",
        type=float,
        default=None,
        help=f"sustained fraction of peak, in (0, 1] (default: {DEFAULT_EFFICIENCY:g})",
    )
    group.add_argument(
        "--time-model",
        metavar="FILE",
        default=None,
        help="TimeModel JSON from `seqbalance calibrate` (replaces --peak-tflops/--efficiency); "
        "with --context-parallel also a ContextParallelTimeModel from `seqbalance calibrate "
        "--context-parallel` (it carries the communication constants and K/V sizes); without, "
        "such a file's compute TimeModel is used",
    )


def load_time_model(
    source: str, *, context_parallel: bool = False
) -> TimeModel | ContextParallelTimeModel:
    """The time model in the JSON file ``source`` (``--time-model``): a ``TimeModel``, or a
    ``ContextParallelTimeModel`` (``seqbalance calibrate --context-parallel``). Without
    ``context_parallel`` the latter gives its compute ``TimeModel``, so a ``TimeModel`` is
    always returned then."""
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--time-model: {not_a_file(path)}")
    model = load_time_model_file(path)
    if isinstance(model, ContextParallelTimeModel) and not context_parallel:
        return model.time
    return model


def describe_time_model(model: Any, source: str) -> str:
    """One line: what ``--time-model`` ``source`` holds and how well it was fitted."""

    def fit(stats: Any) -> str:
        return "" if stats is None else f", fit MAPE {100 * stats.mape:.1f}%"

    if isinstance(model, ContextParallelTimeModel):
        comm = model.comm
        return (
            f"ContextParallelTimeModel from {Path(source)} (K/V gather "
            f"{comm.bandwidth_bytes_per_s / 1e9:.3g} GB/s, {1e6 * comm.latency_s:.0f} us per ring "
            f"step; {1e3 * model.sample_overhead_s:.2f} ms per sample, "
            f"{1e3 * model.piece_overhead_s:.2f} ms more per sharded sample; sharded attention "
            f"x{model.sharded_attention_factor:.2f}; slot jitter {100 * model.slot_jitter:.1f}%"
            f"{fit(model.time.fit_stats)})"
        )
    return f"TimeModel from {Path(source)}{fit(model.fit_stats)}"


def cost_from_args(
    args: argparse.Namespace, *, context_parallel: bool = False
) -> tuple[Any, float, float, str | None]:
    """``(cost, peak FLOP/s, efficiency, description)`` from the cost-model arguments: the
    model read from ``--time-model`` (see :func:`load_time_model`; with its description), or
    the ``--model`` spec whose FLOPs ``seqbalance.cost.seconds_model`` turns into seconds
    (description ``None``)."""
    if args.time_model is not None:
        if args.peak_tflops is not None or args.efficiency is not None:
            raise ValueError(
                "--time-model replaces --peak-tflops/--efficiency; give one or the other"
            )
        model = load_time_model(args.time_model, context_parallel=True)
        description = describe_time_model(model, args.time_model)
        if not context_parallel and isinstance(model, ContextParallelTimeModel):
            model = model.time
            description = f"the compute model of the {description}"
        return model, DEFAULT_PEAK_FLOPS_PER_S, DEFAULT_EFFICIENCY, description
    peak = DEFAULT_PEAK_TFLOPS if args.peak_tflops is None else args.peak_tflops
    efficiency = DEFAULT_EFFICIENCY if args.efficiency is None else args.efficiency
    peak = check_positive_float(peak, "--peak-tflops")
    if not (0 < efficiency <= 1):
        raise ValueError(f"--efficiency must be in (0, 1], got {efficiency!r}")
    if peak * efficiency < MIN_TFLOPS:
        # Seconds are FLOPs divided by it: below 1 FLOP/s they overflowed (a message naming the
        # model's t1) or, at 0, divided by zero (a traceback).
        raise ValueError(
            f"--peak-tflops x --efficiency = {peak!r} x {efficiency!r} TFLOP/s is below "
            f"{MIN_TFLOPS:g} TFLOP/s (1 FLOP/s)"
        )
    return resolve_model(args.model), peak * 1e12, efficiency, None


def time_model_from_args(args: argparse.Namespace) -> tuple[TimeModel, str]:
    """``(time model, one-line description)`` from the cost-model arguments."""
    cost, peak, efficiency, description = cost_from_args(args)
    model, source = seconds_model(resolve_cost(cost), peak_flops_per_s=peak, efficiency=efficiency)
    return model, description or source


def with_kv_sizes(cost: Any, args: argparse.Namespace) -> Any:
    """A context-parallel ``cost``: a calibrated compute ``TimeModel`` (``--time-model``) gets
    the K/V sizes of ``--model`` that the communication needs; any other cost as it is."""
    if isinstance(cost, TimeModel):
        return ContextParallelTimeModel.from_model(resolve_model(args.model), time=cost)
    return cost


def context_parallel_cost_from_args(args: argparse.Namespace) -> tuple[Any, str | None]:
    """``(ContextParallelTimeModel, description)`` from the cost-model arguments, for
    ``--context-parallel``: a ``ContextParallelTimeModel`` file as it is, a ``TimeModel`` file
    with the K/V sizes of ``--model``, or ``--model``'s FLOPs at ``--peak-tflops`` x
    ``--efficiency`` (description None)."""
    cost, peak, efficiency, description = cost_from_args(args, context_parallel=True)
    cost = with_kv_sizes(cost, args)
    if not isinstance(cost, ContextParallelTimeModel):
        cost = ContextParallelTimeModel.from_model(
            cost, peak_flops_per_s=peak, efficiency=efficiency
        )
    return cost, description


# ---------------------------------------------------------------------- plan options as flags
_NO_FLAG = ("cost", "model", "strategy", "max_vision_patches", "context_parallel")
"""Plan options set by other flags (the cost-model flags, --strategy / --strategies,
--context-parallel) or that need data the CLI cannot load (vision patches come with parts)."""


class _OldSpelling(argparse.Action):
    """A flag's old spelling, kept for one release: it sets the new flag's value and says on
    stderr that it is deprecated."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog}: warning: {message(option_string, self.new)}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_plan_option_arguments(
    parser: argparse.ArgumentParser, *, max_tokens_default: int | None, bound_effort: bool = False
) -> None:
    """Add one flag per plan option (same names in plan, simulate and bench): ``--max-tokens``,
    ``--layout``, ``--microbatch-size`` (``--micro-batch-size``, its old spelling, still
    works), ``--num-microbatches``, ``--min-microbatches``,
    ``--microbatch-multiple``, ``--objective``, ``--order``, ``--allow-oversize``,
    ``--allow-empty``, ``--rank-speeds``, ``--planning-budget``, and ``--bound-effort`` where
    ``bound_effort`` (a command that reports the count bound it tightens: plan; simulate and
    bench report none, so there it would only cost time). Read them back with
    :func:`plan_options_from_args`."""
    group = parser.add_argument_group("plan options")
    cap = "none" if max_tokens_default is None else str(max_tokens_default)
    group.add_argument(
        "--max-tokens",
        type=int,
        default=max_tokens_default,
        help=f"hard token cap per micro-batch, padding included (default: {cap})",
    )
    group.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="packed",
        help="packed (THD, default) or padded (BSHD; needs --microbatch-size)",
    )
    group.add_argument(
        "--microbatch-size", type=int, default=None, help="samples per padded micro-batch"
    )
    group.add_argument(
        "--micro-batch-size",
        dest="microbatch_size",
        type=int,
        action=_OldSpelling,
        new="--microbatch-size",
        help=argparse.SUPPRESS,
    )
    for name, kind, default, text in (
        ("--num-microbatches", int, None, "exact micro-batches per rank (default: the fewest)"),
        ("--min-microbatches", int, 1, "at least this many per rank (default 1)"),
        ("--microbatch-multiple", int, 1, "the count is a multiple of this (pipelines; default 1)"),
        ("--rank-speeds", _speeds, None, "speed of every rank, e.g. 1,1,1,0.67 (default: equal)"),
        ("--planning-budget", int, None, "samples x ranks up to which dear rivals run too"),
    ):
        group.add_argument(name, type=kind, default=default, help=text)
    if bound_effort:
        group.add_argument(
            "--bound-effort",
            type=int,
            default=None,
            help="level vectors a padded lockstep count bound may search (default: none)",
        )
    add_objective_argument(group)
    group.add_argument(
        "--order",
        choices=ORDERS,
        default="none",
        help="execution order of each rank's micro-batches (default: none)",
    )
    group.add_argument(
        "--allow-oversize",
        action="store_true",
        help="a sample longer than --max-tokens gets a micro-batch of its own (default: error)",
    )
    group.add_argument(
        "--allow-empty", action="store_true", help="allow empty micro-batches (default: error)"
    )


def _flag_options() -> tuple[str, ...]:
    """The plan options that ``add_plan_option_arguments`` defines a flag for."""
    return tuple(name for name in option_names() if name not in _NO_FLAG)


def flag(option: str) -> str:
    """The command-line flag of a plan option (``max_tokens`` -> ``--max-tokens``)."""
    return "--" + option.replace("_", "-")


def plan_options_from_args(args: argparse.Namespace, **fixed: Any) -> Any:
    """``PlanOptions`` from the flags of :func:`add_plan_option_arguments` plus ``fixed``
    options (e.g. ``cost``; they replace a flag's value); a ValueError names the flags, not
    the Python keywords."""
    # --bound-effort exists in plan only (add_plan_option_arguments): elsewhere its default.
    values = {
        name: getattr(args, name)
        for name in _flag_options()
        if name != "bound_effort" or hasattr(args, name)
    }
    try:
        return PlanOptions(**{**values, **fixed})
    except ValueError as error:
        raise ValueError(flag_names(str(error), CONTEXT_PARALLEL_FLAGS)) from None


# ---------------------------------------------------------------------- context parallelism
CONTEXT_PARALLEL_FLAGS = {
    **{name: flag(name) for name in _flag_options()},
    "context_parallel": "--context-parallel",
}
"""The plan options' flags and that of :func:`add_context_parallel_arguments`."""
STEP_FLAGS = {"dp_size": "--dp", "global_batch_size": "--global-batch", "seed": "--seed"}
"""The flags of plan's and simulate's own arguments that the library names otherwise (its
messages said "dp_size must be <= 2**18" of ``--dp``)."""


def _numbers(kind: type, what: str) -> Any:
    """An argparse ``type``: comma-separated values of ``kind`` as a tuple (their checks are
    the library's)."""

    def parse(text: str) -> tuple:
        parts = [part.strip() for part in text.split(",")]
        if "" in parts:  # "1,,0.5" is a value left out, not two values: one per rank counts
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r} (an empty value)"
            )
        try:
            return tuple(kind(part) for part in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r}"
            ) from None

    return parse


_sizes = _numbers(int, "integers")
_speeds = _numbers(float, "numbers, one per rank")


class _Removed(argparse.Action):
    """A flag that is gone: using it is a one-line error naming its replacement."""

    def __init__(self, *args: Any, replacement: str, **keywords: Any) -> None:
        super().__init__(*args, help=argparse.SUPPRESS, **keywords)
        self.replacement = replacement

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **keywords: Any) -> None:
        parser.error(f"{self.option_strings[0]} is gone: {self.replacement}")


def add_context_parallel_arguments(parser: argparse.ArgumentParser, description: str) -> None:
    """Add ``--context-parallel SIZES`` (plan, simulate, bench, calibrate), in a group described
    by ``description``; the per-rank cap is ``--max-tokens``. Read it with
    :func:`context_parallel_from_args`."""
    group = parser.add_argument_group("context parallelism", description)
    group.add_argument(
        "--context-parallel",
        type=_sizes,
        default=None,
        metavar="SIZES",
        help="allowed CP group sizes, comma-separated and ascending, e.g. 1,2,4,8 (the per-rank "
        "token cap, the tokens one rank holds in one slot, is --max-tokens)",
    )
    group.add_argument(
        "--max-tokens-per-rank",
        action=_Removed,
        replacement="use --max-tokens (with --context-parallel it is the per-rank cap, the "
        "tokens one rank holds in one slot)",
    )


def context_parallel_from_args(args: argparse.Namespace) -> ContextParallel | None:
    """The ``ContextParallel`` options of ``--context-parallel``, or None without it.

    Raises:
        ValueError: bad sizes (the message names the flag).
    """
    if args.context_parallel is None:
        return None
    try:
        return ContextParallel(sizes=args.context_parallel)
    except ValueError as error:
        raise ValueError(
            f"--context-parallel: {flag_names(str(error), CONTEXT_PARALLEL_FLAGS)}"
        ) from None


def flag_names(message: str, flags: Mapping[str, str] | None = None) -> str:
    """``message`` with option names and ``name=True`` advice written as flags.

    Args:
        message: A library error message.
        flags: Keyword name -> flag; default: the plan options (``max_tokens`` ->
            ``--max-tokens``, ...).
    """
    if flags is None:
        flags = {name: flag(name) for name in _flag_options()}
    for name in sorted(flags, key=len, reverse=True):
        message = re.sub(rf"\b{name}=True\b", flags[name], message)
        message = re.sub(rf"(?<![\w-]){name}\b", flags[name], message)
    return message


def require_torch() -> None:
    """Raise ImportError with the one-line fix when PyTorch is not installed.

    A torch that is installed but fails to import raises its own error unchanged.
    """
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        raise ImportError(
            'this command needs PyTorch, which is not installed: pip install "seqbalance[torch]"'
        ) from None
