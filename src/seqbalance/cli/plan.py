"""`seqbalance plan`: place one step's (or an epoch's) samples on ranks and micro-batches."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seqbalance.cli._common import (
    CONTEXT_PARALLEL_FLAGS,
    add_context_parallel_arguments,
    add_json_flag,
    add_plan_option_arguments,
    add_time_model_arguments,
    context_parallel_cost_from_args,
    context_parallel_from_args,
    flag_names,
    load_lengths,
    plan_options_from_args,
    print_json,
    print_table,
    time_model_from_args,
)
from seqbalance.plan import plan_epoch, plan_step, strategy_names


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan one step (or an epoch) of a lengths file and write the plan as JSON",
        description=(
            "Assign the samples of LENGTHS to --dp ranks and packed micro-batches under the "
            "token cap, minimising the predicted step time. Without --global-batch all samples "
            "form one step (a StepPlan); with it, the samples are shuffled into steps of that "
            "many samples (an epoch). Costs are predicted seconds (see the cost model options). "
            "With --context-parallel, one step's samples are planned over CP groups of the --dp "
            "ranks (a ContextParallelPlan)."
        ),
    )
    parser.add_argument(
        "lengths", metavar="LENGTHS", help=".npy file of token lengths, or a bundled dataset name"
    )
    parser.add_argument("--dp", type=int, required=True, help="data-parallel ranks")
    names = strategy_names()
    cp_names = strategy_names(context_parallel=True)
    parser.add_argument(
        "--strategy",
        choices=[*names, *(name for name in cp_names if name not in names)],
        default="balanced",
        help="default: balanced (with --context-parallel: "
        + ", ".join(cp_names)
        + "; the others without it)",
    )
    add_plan_option_arguments(parser, max_tokens_default=None)
    parser.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="samples per step: plan a shuffled epoch instead of a single step",
    )
    parser.add_argument("--seed", type=int, default=0, help="epoch shuffle seed")
    add_time_model_arguments(parser)
    add_context_parallel_arguments(
        parser,
        "Shard samples longer than one rank's cap over context-parallel groups of the --dp "
        "ranks: one step only (no --global-batch). --num-microbatches, --min-microbatches, "
        "--microbatch-multiple and --allow-empty apply to the slots; --time-model takes a "
        "TimeModel (K/V sizes from --model) or a ContextParallelTimeModel from `seqbalance "
        "calibrate --context-parallel`.",
        cap_help="--max-tokens",
    )
    parser.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan JSON here")
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    source = load_lengths(args.lengths, argument="LENGTHS")
    context_parallel = context_parallel_from_args(args, max_tokens=args.max_tokens)
    if context_parallel is not None:
        return _run_context_parallel(args, source, context_parallel)
    time_model, time_model_source = time_model_from_args(args)
    options = plan_options_from_args(args, cost=time_model, strategy=args.strategy)
    try:
        if args.global_batch is None:
            plan = plan_step(source.lengths, args.dp, options, groups=source.groups)
        else:
            epoch = plan_epoch(
                source.lengths,
                args.global_batch,
                args.dp,
                options,
                groups=source.groups,
                seed=args.seed,
            )
    except ValueError as error:
        raise ValueError(flag_names(str(error))) from None
    # plan_step validates every plan it returns (plan_epoch's steps included).
    if args.global_batch is None:
        steps = [plan]
        document: dict[str, Any] = json.loads(plan.to_json())
    else:
        steps = list(epoch.steps)
        document = {
            "steps": [json.loads(step_plan.to_json()) for step_plan in epoch.steps],
            "sample_indices": [indices.tolist() for indices in epoch.sample_indices],
        }
    summaries = [step_plan.summary() for step_plan in steps]
    return _write_and_print(
        args,
        source.label,
        document,
        summaries,
        time_model_source,
        lambda: _print_summaries(summaries, source.label, args, time_model_source),
    )


def _write_and_print(
    args: argparse.Namespace,
    label: str,
    document: dict[str, Any],
    summaries: list[dict[str, Any]],
    time_model_source: str,
    print_summaries: Callable[[], None],
) -> int:
    """Write the plan ``document`` to ``--output`` when given, then print the JSON payload
    (``--json``: the summaries, and the plan itself when it was not written) or the table
    (``print_summaries``)."""
    if args.output:
        Path(args.output).write_text(json.dumps(document) + "\n", encoding="utf-8")
    if args.json:
        payload: dict[str, Any] = {
            "lengths": label,
            "time_model_source": time_model_source,
            "summaries": summaries,
            "output": args.output,
        }
        if not args.output:
            payload["plan"] = document
        print_json(payload)
        return 0
    print_summaries()
    if args.output:
        print(f"plan written to {args.output}")
    return 0


def _run_context_parallel(args: argparse.Namespace, source: Any, context_parallel: Any) -> int:
    """``plan --context-parallel``: one step over CP groups, written as a ContextParallelPlan."""
    if args.global_batch is not None:
        raise ValueError("--global-batch does not apply with --context-parallel: it plans one step")
    cost, description = context_parallel_cost_from_args(args)
    options = plan_options_from_args(
        args,
        cost=cost,
        strategy=args.strategy,
        max_tokens=None,  # the per-rank cap is --max-tokens-per-rank (or --max-tokens)
        context_parallel=context_parallel,
    )
    try:
        plan = plan_step(source.lengths, args.dp, options, groups=source.groups)
    except ValueError as error:
        raise ValueError(flag_names(str(error), CONTEXT_PARALLEL_FLAGS)) from None
    summary = plan.summary()
    source_text = description or f"{args.model} FLOPs at peak x efficiency"
    return _write_and_print(
        args,
        source.label,
        json.loads(plan.to_json()),
        [summary],
        source_text,
        lambda: _print_context_parallel_summary(
            summary, source.label, args, context_parallel, source_text
        ),
    )


def _print_context_parallel_summary(
    summary: dict[str, Any],
    label: str,
    args: argparse.Namespace,
    context_parallel: Any,
    source: str,
) -> None:
    print_table(
        f"{label}: {args.strategy} on {args.dp} ranks, CP sizes "
        f"{list(context_parallel.sizes)}, {context_parallel.max_tokens_per_rank} tokens per rank",
        (
            "step time (s)",
            "lower bound (s)",
            "vs bound",
            "slots",
            "empty slots",
            "sharded samples",
            "plan ms",
        ),
        [
            (
                f"{summary['step_cost']:.3f}",
                f"{summary['lower_bound']:.3f}",
                f"{summary['ratio']:.3f}",
                summary["n_slots"],
                summary["empty_slots"],
                f"{summary['sharded_samples']} of {summary['n_samples']}",
                f"{1e3 * summary['planning_seconds']:.1f}",
            )
        ],
        caption=f"time model: {source}",
    )


def _print_summaries(
    summaries: list[dict[str, Any]], label: str, args: argparse.Namespace, source: str
) -> None:
    rows = [
        (
            step,
            f"{summary['step_cost']:.3f}",
            f"{summary['lower_bound']:.3f}",
            f"{summary['ratio']:.3f}",
            f"{summary['imbalance']:.3f}",
            summary["n_microbatches"],
            summary["cap_violations"],
            f"{1e3 * summary['planning_seconds']:.1f}",
        )
        for step, summary in enumerate(summaries)
    ]
    print_table(
        f"{label}: {args.strategy} on {args.dp} ranks, max_tokens {args.max_tokens}, "
        f"objective {args.objective}",
        (
            "step",
            "step time (s)",
            "lower bound (s)",
            "vs bound",
            "imbalance",
            "micro-batches",
            "cap violations",
            "plan ms",
        ),
        rows,
        caption=f"time model: {source}",
    )
