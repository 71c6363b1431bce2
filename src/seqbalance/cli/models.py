"""`seqbalance models`: the bundled model presets, their sizes and what a token costs on each."""

from __future__ import annotations

import argparse
from typing import Any

from seqbalance.cli._common import add_json_flag, print_json, print_table


def register(subparsers: Any) -> None:
    from seqbalance.cost.flops import PRESET_REFERENCE_LENGTH

    parser = subparsers.add_parser(
        "models",
        help="list the model presets (use their names with --model)",
        description=(
            "List the bundled model presets with their shape, layer kinds (token mixers), total "
            "and active parameters, and the training FLOPs per token (forward + backward) of a "
            f"{PRESET_REFERENCE_LENGTH}-token sample, attention included."
        ),
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


def layer_kinds(counts: dict[str, int]) -> str:
    """``{"full_attention": 12, "linear_attention": 36}`` -> ``"12 full + 36 linear"``."""
    return " + ".join(
        f"{count} {kind.removesuffix('_attention')}" for kind, count in counts.items()
    )


def run(args: argparse.Namespace) -> int:
    from seqbalance.cost import describe_preset, presets
    from seqbalance.cost.flops import PRESET_REFERENCE_LENGTH

    models = [describe_preset(name) for name in presets()]
    if args.json:
        print_json(models)
        return 0
    rows = []
    for model in models:
        spec = model["spec"]
        kv_heads = spec["num_key_value_heads"] or spec["num_attention_heads"]
        moe = f"{spec['num_experts_per_tok']}/{spec['num_experts']}" if model["moe"] else "-"
        rows.append(
            (
                model["name"],
                f"{model['total_params'] / 1e9:.2f}",
                f"{model['active_params'] / 1e9:.2f}",
                spec["num_layers"],
                layer_kinds(model["layer_kinds"]),
                spec["hidden_size"],
                f"{spec['num_attention_heads']}/{kv_heads}",
                spec["vocab_size"],
                moe,
                f"{model['training_flops_per_token_at_4k'] / 1e9:.1f}",
            )
        )
    print_table(
        "model presets",
        (
            "preset",
            "params B",
            "active B",
            "layers",
            "layer kinds",
            "hidden",
            "heads q/kv",
            "vocab",
            "MoE experts",
            "GFLOP/token",
        ),
        rows,
        caption=(
            "params B / active B: billions of parameters, all experts / those one token uses "
            "(top-k routed + shared experts), embeddings included, norms and MTP modules not; "
            "layer kinds: layers per token mixer (full/sliding/chunked softmax attention, linear "
            "= Gated DeltaNet, mamba/mamba2, none = MLP only); "
            "MoE experts: active/total; GFLOP/token: training (forward + backward) per token of "
            f"a {PRESET_REFERENCE_LENGTH}-token sample, attention included"
        ),
    )
    return 0
