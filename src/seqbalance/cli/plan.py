"""`seqbalance plan`: place one step's (or an epoch's) samples on ranks and micro-batches."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from seqbalance.cli._common import (
    CONTEXT_PARALLEL_FLAGS,
    STEP_FLAGS,
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
    write_output,
)
from seqbalance.plan import plan_epoch, plan_step, strategy_names

ONE_STEP_HINT_SAMPLES = 32_768
"""Above this many samples planned as one step (no --global-batch), say so before planning: a
whole dataset given without --global-batch is one step, which can take tens of seconds to plan
(one step of 50,000 samples on 8 ranks: ~20 s), where the user usually meant an epoch."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan one step (or an epoch) of a lengths file and write the plan as JSON",
        description=(
            "Assign the samples of LENGTHS to --dp ranks and packed micro-batches under the "
            "token cap, minimising the predicted step time. Without --global-batch all samples "
            "form one step (a StepPlan); with it, the samples are shuffled into steps of that "
            "many samples (an epoch). Costs are predicted seconds (see the cost model options). "
            "With --context-parallel, each step's samples are planned over CP groups of the --dp "
            "ranks (a ContextParallelPlan per step)."
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
    add_plan_option_arguments(parser, max_tokens_default=None, bound_effort=True)
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
        "Shard samples longer than one rank's cap (--max-tokens: the tokens one rank holds in "
        "one slot) over context-parallel groups of the --dp ranks, one step or an epoch "
        "(--global-batch). --num-microbatches, --min-microbatches, --microbatch-multiple and "
        "--allow-empty apply to the slots; --time-model takes a TimeModel (K/V sizes from "
        "--model) or a ContextParallelTimeModel from `seqbalance calibrate --context-parallel`.",
    )
    parser.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan JSON here")
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    source = load_lengths(args.lengths, argument="LENGTHS")
    if args.global_batch is None and source.lengths.size > ONE_STEP_HINT_SAMPLES:
        print(
            f"seqbalance plan: note: all {source.lengths.size:,} samples are planned as one "
            "step, which can take a while; pass --global-batch N to plan an epoch of steps of "
            "N samples",
            file=sys.stderr,
        )
    context_parallel = context_parallel_from_args(args)
    if context_parallel is None:
        cost, time_model_source = time_model_from_args(args)
    else:
        cost, description = context_parallel_cost_from_args(args)
        time_model_source = description or f"{args.model} FLOPs at peak x efficiency"
    options = plan_options_from_args(
        args, cost=cost, strategy=args.strategy, context_parallel=context_parallel
    )
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
        raise ValueError(flag_names(str(error), {**CONTEXT_PARALLEL_FLAGS, **STEP_FLAGS})) from None
    # plan_step validates every plan it returns (plan_epoch's steps included).
    if args.global_batch is None:
        steps = [plan]
        document: dict[str, Any] = json.loads(plan.to_json())
    else:
        steps = list(epoch.steps)
        # The EpochPlan document (EpochPlan.from_json reads it back): the steps and their
        # samples as before, with the epoch's own fields (it had no format and no seed).
        document = json.loads(epoch.to_json())
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
        text = json.dumps(document) + "\n"
        write_output(args.output, "-o/--output", lambda path: path.write_text(text, "utf-8"))
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
            *(
                (f"{summary['sharded_samples']} of {summary['n_samples']}",)
                if "sharded_samples" in summary
                else ()
            ),
        )
        for step, summary in enumerate(summaries)
    ]
    sizes = args.context_parallel
    print_table(
        f"{label}: {args.strategy} on {args.dp} ranks, max_tokens {args.max_tokens}"
        + (f", objective {args.objective}" if sizes is None else f", CP sizes {list(sizes)}"),
        (
            "step",
            "step time (s)",
            "lower bound (s)",
            "vs bound",
            "imbalance",
            "micro-batches",
            "cap violations",
            "plan ms",
            *(() if sizes is None else ("sharded samples",)),
        ),
        rows,
        caption=f"time model: {source}",
    )
