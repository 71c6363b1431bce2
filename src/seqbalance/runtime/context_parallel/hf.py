"""The context-parallel attention as a Hugging Face attention implementation.

``register_attention()`` adds :data:`ATTENTION_NAME` (``"seqbalance_cp"``) to transformers'
``AttentionInterface``; a causal LM built or switched to it (``from_config(...,
attn_implementation="seqbalance_cp")``, ``model.set_attn_implementation("seqbalance_cp")``)
computes every attention layer with the slot's
:class:`~seqbalance.runtime.context_parallel.SlotAttention`, which its forward takes as the
keyword ``slot_attention`` (transformers hands a forward's extra keywords down to the attention
function, as it does flash-attention's ``cu_seq_lens_q``)::

    register_attention()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="seqbalance_cp")
    attention = SlotAttention(plan.slot_inputs(rank, slot), groups)
    logits = model(input_ids=ids[None], position_ids=positions[None],
                   slot_attention=attention).logits[0]

The slot is one packed row (batch 1, the rank's local tokens), ``position_ids`` each token's
position in its sample (rotary embeddings then see the true positions of a shard's tokens).
Transformers builds no attention mask for an implementation it has no mask function for, so
nothing of size tokens² is made. What this attention does not compute raises a ``ValueError``
instead of computing something else: a missing ``slot_attention``, a batch of more than one row,
an explicit mask, sliding windows, logit soft-capping, attention sinks, non-causal layers.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils.checkpoint

from seqbalance.runtime.context_parallel.slot_attention import SlotAttention

__all__ = [
    "ATTENTION_NAME",
    "attention_forward",
    "check_implementation",
    "register_attention",
    "slot_logits",
]

ATTENTION_NAME = "seqbalance_cp"
"""The name of the context-parallel attention in transformers' ``AttentionInterface``."""

_UNSUPPORTED = ("sliding_window", "softcap", "s_aux")
"""Attention-function keywords of features this attention does not compute."""


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function contract: ``query`` ``[1, heads, tokens, head_dim]``,
    ``key``, ``value`` ``[1, kv heads, tokens, head_dim]``; returns the output ``[1, tokens,
    heads, head_dim]`` and no attention weights. The slot comes as the ``slot_attention``
    keyword of the model's forward."""
    attention = kwargs.get("slot_attention")
    if not isinstance(attention, SlotAttention):
        raise ValueError(
            f"attn_implementation {ATTENTION_NAME!r} computes a context-parallel slot: pass "
            "slot_attention=SlotAttention(...) to the model's forward, got "
            f"{type(attention).__name__}"
        )
    if query.shape[0] != 1:
        raise ValueError(
            f"a context-parallel slot is one packed row: the batch must be 1, got {query.shape[0]}"
        )
    if attention_mask is not None:
        raise ValueError(
            f"attn_implementation {ATTENTION_NAME!r} takes no attention_mask: the slot's inputs "
            "say which tokens attend to which"
        )
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise ValueError(
                f"attn_implementation {ATTENTION_NAME!r} does not support {name} "
                f"(got {kwargs[name]!r}): it computes full causal attention"
            )
    if not getattr(module, "is_causal", True):
        raise ValueError(f"attn_implementation {ATTENTION_NAME!r} computes causal layers only")
    out = attention(query[0], key[0], value[0], scale=scaling, dropout=dropout)
    return out.transpose(0, 1)[None], None


def register_attention() -> str:
    """Add the context-parallel attention to transformers' ``AttentionInterface`` (once per
    process; again is harmless) and return its name, :data:`ATTENTION_NAME`."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    return ATTENTION_NAME


def check_implementation(model: torch.nn.Module) -> None:
    """What :func:`slot_logits` needs of ``model``: attention computed by
    :data:`ATTENTION_NAME`, and no reentrant activation checkpointing (while it trains).
    ``run_step`` checks it in its agreement, so that a rank whose model uses another
    implementation fails on every rank, not alone in its first slot.

    Raises:
        ValueError: the model does not use :data:`ATTENTION_NAME` (it would attend across the
            packed pieces as if they were one sequence), or checkpoints reentrantly.
    """
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation != ATTENTION_NAME:
        raise ValueError(
            f"the model's attn_implementation is {implementation!r}: a context-parallel slot "
            f"needs {ATTENTION_NAME!r} (register_attention(), then "
            f"model.set_attn_implementation({ATTENTION_NAME!r}))"
        )
    # A reentrant checkpoint recomputes a layer inside backward on inputs cut from the graph,
    # so the slot's collective-order chain was backwarded twice: torch's RuntimeError "Trying
    # to backward through the graph a second time" (adv19d M4). Non-reentrant ones are exact.
    # torch's checkpoint runs reentrant unless told use_reentrant=False (review19 item 9:
    # transformers passes gradient_checkpointing_kwargs={} through as given); transformers
    # binds those keywords in a functools.partial, of torch's function or of its offload
    # wrapper, which forwards them to it (review19 item 11).
    for module in model.modules():
        function = getattr(module, "_gradient_checkpointing_func", None)
        if isinstance(function, functools.partial):
            keywords = function.keywords
        elif function is torch.utils.checkpoint.checkpoint:
            keywords = {}
        else:  # none, or a function of the user's: its keywords are not torch's to read
            continue
        if (
            module.training
            and getattr(module, "gradient_checkpointing", False)
            and keywords.get("use_reentrant", True) is not False
        ):
            raise ValueError(
                "the model uses reentrant activation checkpointing, which a context-parallel "
                "slot cannot run: enable it with gradient_checkpointing_kwargs="
                "{'use_reentrant': False} (transformers' default)"
            )


def slot_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention: SlotAttention,
) -> torch.Tensor:
    """Logits ``[tokens, vocab]`` of a Hugging Face causal LM over one slot's packed tokens
    (``input_ids``, ``position_ids``: ``[tokens]``), its attention computed by ``attention``.

    Raises:
        ValueError: the model does not use :data:`ATTENTION_NAME` (see
            :func:`check_implementation`).
    """
    check_implementation(model)
    output = model(
        input_ids=input_ids[None],
        position_ids=position_ids[None],
        slot_attention=attention,
        use_cache=False,
    )
    return output.logits[0]
