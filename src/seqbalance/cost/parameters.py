"""Parameter counts of a :class:`~seqbalance.cost.spec.ModelSpec`'s matrices, by component.

The spec's parameter counts and the FLOPs formula (:mod:`seqbalance.cost.flops`) both start from
:class:`MatmulParameters`, which ``ModelSpec.matmul_parameters()`` (the one place that knows the
matrix shapes) builds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MatmulParameters"]


@dataclass(frozen=True)
class MatmulParameters:
    """Weights (parameter counts) of a spec's matrices, one entry per component.

    Built by ``ModelSpec.matmul_parameters()``: :meth:`ModelSpec.num_parameters` sums these
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
