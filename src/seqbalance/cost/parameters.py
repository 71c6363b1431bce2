"""Parameter counts of a :class:`~seqbalance.cost.spec.ModelSpec`'s matrices, by component.

The one place that knows the matrix shapes: the spec's parameter counts and the FLOPs formula
(:mod:`seqbalance.cost.flops`) both start from :class:`MatmulParameters`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seqbalance.cost.spec import ModelSpec

__all__ = ["MatmulParameters"]


@dataclass(frozen=True)
class MatmulParameters:
    """Weights (parameter counts) of a spec's matrices, one entry per component.

    The one place that knows the matrix shapes: :meth:`ModelSpec.num_parameters` sums these
    and :class:`~seqbalance.cost.flops.FlopsModel` turns them into FLOPs per token (2 per weight a
    token passes through). Biases, norms and the shared-expert gate (``hidden x 1``) are not
    counted.
    """

    attention: int
    """One softmax-attention layer's projections (GQA Q/K/V/O with the optional output gate, or
    the MLA projections)."""
    linear_attention: int
    """One Gated DeltaNet layer's projections and convolution (0 without such layers)."""
    mamba: int
    """One Mamba layer's projections and convolution (0 without such layers)."""
    dense_mlp: int
    """One dense MLP (gated: 3 matrices, plain: 2, of ``hidden x intermediate_size``)."""
    router: int
    """One MoE layer's router (``hidden x num_experts``)."""
    expert: int
    """One routed expert (gated like the dense MLP, ``hidden x moe_intermediate_size``)."""
    shared_experts: int
    """All shared experts of one MoE layer together (0 when there are none)."""
    embedding: int
    """One ``vocab x hidden`` table: the input embedding, or the LM head (same shape)."""
    mtp_projection: int
    """One multi-token-prediction module's ``2·hidden -> hidden`` projection."""
    cross_attention_query_output: int
    """One cross-attention layer's Q and O projections (applied to decoder tokens)."""
    cross_attention_key_value: int
    """One cross-attention layer's K and V projections (applied to encoder tokens)."""

    def moe_mlp(self, experts: int) -> int:
        """One MoE layer's router, ``experts`` routed experts and its shared experts."""
        return self.router + experts * self.expert + self.shared_experts

    @classmethod
    def of(cls, spec: ModelSpec) -> MatmulParameters:
        """The weights of ``spec``'s matrices."""
        hidden = spec.hidden_size
        heads = spec.num_attention_heads
        mlp_matrices = 3 if spec.gated_mlp else 2
        if spec.is_mla:
            kv_lora = int(spec.kv_lora_rank)  # type: ignore[arg-type]
            if spec.q_lora_rank is None:
                query = hidden * heads * spec.qk_head_dim
            else:
                query = hidden * spec.q_lora_rank + spec.q_lora_rank * heads * spec.qk_head_dim
            key_value = hidden * (kv_lora + spec.qk_rope_head_dim) + kv_lora * heads * (
                spec.qk_nope_head_dim + spec.value_head_dim
            )
            attention = query + key_value + heads * spec.value_head_dim * hidden
        else:
            kv_heads = int(spec.num_key_value_heads)  # type: ignore[arg-type]
            attention = 2 * hidden * (heads + kv_heads) * spec.qk_head_dim
        if spec.attention_output_gate:
            attention += hidden * heads * spec.value_head_dim
        mamba_kind = next((k for k in ("mamba", "mamba2") if k in (spec.layer_types or ())), None)
        encoder_hidden = spec.encoder_hidden_size or hidden
        kv_width = int(spec.num_key_value_heads) * spec.head_dim  # type: ignore[operator]
        return cls(
            attention=attention,
            linear_attention=(
                spec.linear_attention.parameters(hidden) if spec.linear_attention else 0
            ),
            mamba=(spec.mamba.parameters(hidden, mamba_kind) if spec.mamba and mamba_kind else 0),
            dense_mlp=mlp_matrices * hidden * spec.intermediate_size,
            router=hidden * spec.num_experts,
            expert=mlp_matrices * hidden * spec.moe_intermediate_size,
            shared_experts=mlp_matrices * hidden * spec.shared_expert_intermediate_size,
            embedding=spec.vocab_size * hidden,
            mtp_projection=2 * hidden * hidden,
            cross_attention_query_output=2 * hidden * heads * int(spec.head_dim),  # type: ignore[arg-type]
            cross_attention_key_value=2 * encoder_hidden * kv_width,
        )
