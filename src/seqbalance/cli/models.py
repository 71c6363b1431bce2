"""`seqbalance models`: the bundled model presets, their sizes and what a token costs on each."""

from __future__ import annotations

import argparse
from typing import Any

from seqbalance.cli._common import add_json_flag, print_json, print_table
from seqbalance.cost import HSTUFlopsModel, HSTUSpec, describe_preset, hstu_presets, presets
from seqbalance.cost.flops import PRESET_REFERENCE_LENGTH


def register(subparsers: Any) -> None:
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


def describe_hstu_preset(name: str) -> dict[str, Any]:
    """The HSTU preset ``name`` in the shape of ``describe_preset``'s entries (``kind``
    ``"hstu"``; its FLOPs per token are those of one causal ``PRESET_REFERENCE_LENGTH``-token
    sequence)."""
    spec = HSTUSpec.preset(name)
    training = float(HSTUFlopsModel(spec).per_sample([PRESET_REFERENCE_LENGTH])[0])
    return {
        "kind": "hstu",
        "name": name,
        "spec": spec.to_dict(),
        "moe": False,
        "layer_kinds": {"hstu": spec.num_layers},
        "total_params": spec.num_parameters(),
        "active_params": spec.num_parameters(),
        "training_flops_per_token_at_4k": training / PRESET_REFERENCE_LENGTH,
    }


def run(args: argparse.Namespace) -> int:
    # One namespace, one listing: the language-model presets, then the HSTU ones.
    models = [
        *({"kind": "language_model", **describe_preset(name)} for name in presets()),
        *(describe_hstu_preset(name) for name in hstu_presets()),
    ]
    if args.json:
        print_json(models)
        return 0
    rows = []
    for model in models:
        spec = model["spec"]
        if model["kind"] == "hstu":
            heads, vocab = str(spec["num_heads"]), "-"
        else:
            kv_heads = spec["num_key_value_heads"] or spec["num_attention_heads"]
            heads, vocab = f"{spec['num_attention_heads']}/{kv_heads}", spec["vocab_size"]
        moe = f"{spec['num_experts_per_tok']}/{spec['num_experts']}" if model["moe"] else "-"
        rows.append(
            (
                model["name"],
                f"{model['total_params'] / 1e9:.2f}",
                f"{model['active_params'] / 1e9:.2f}",
                spec["num_layers"],
                layer_kinds(model["layer_kinds"]),
                spec["hidden_size"],
                heads,
                vocab,
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
            "(top-k routed + shared experts), embeddings included, norms and MTP modules not "
            "(HSTU: the layers' matmul weights, no embedding tables); "
            "layer kinds: layers per token mixer (full/sliding/chunked softmax attention, linear "
            "= Gated DeltaNet, mamba/mamba2, none = MLP only, hstu = HSTU layers); "
            "MoE experts: active/total; GFLOP/token: training (forward + backward) per token of "
            f"a {PRESET_REFERENCE_LENGTH}-token sample, attention included"
        ),
    )
    return 0
