"""FlopsMeter: accumulate the FLOPs of micro-batches, then report TFLOP/s and MFU (numpy only).

The meter counts what you add to it. Add only this process's micro-batches to measure this rank
(``world_size=1``), or add every rank's micro-batches (e.g. after gathering their lengths) and
pass ``world_size`` = number of ranks to get the average per GPU. The torch runtime's meter
reduces the totals across ranks and then uses the second form.
"""

from __future__ import annotations

from typing import Any

from seqbalance._validation import as_lengths, check_bool, check_int, check_positive_float
from seqbalance.cost.flops import FlopsModel, _segment_lengths

__all__ = ["FlopsMeter"]


class FlopsMeter:
    """Running total of FLOPs (training FLOPs by default) and tokens of added micro-batches.

    ``backward=True`` counts forward + backward (3x forward, 4x with the model's ``recompute``);
    ``backward=False`` counts forward FLOPs only (inference).
    """

    def __init__(self, flops_model: FlopsModel, *, backward: bool = True) -> None:
        if not isinstance(flops_model, FlopsModel):
            raise ValueError(f"flops_model must be a FlopsModel, got {type(flops_model).__name__}")
        self.flops_model = flops_model
        self.backward = check_bool(backward, "backward")
        self.reset()

    def reset(self) -> None:
        """Forget everything added so far."""
        self.total_flops = 0.0
        self.tokens = 0
        self.samples = 0
        self.microbatches = 0

    def add(
        self, lengths: Any = None, *, cu_seqlens: Any = None, valid: int | None = None
    ) -> float:
        """Add one micro-batch, given its sample ``lengths`` or its packed ``cu_seqlens``.

        Exactly one of ``lengths`` and ``cu_seqlens`` must be given; ``valid`` (the number of
        valid leading ``cu_seqlens`` entries, see :meth:`FlopsModel.packed`) only with
        ``cu_seqlens``. Returns the FLOPs of this micro-batch.
        """
        if (lengths is None) == (cu_seqlens is None):
            raise ValueError("give exactly one of lengths and cu_seqlens")
        if cu_seqlens is None:
            if valid is not None:
                raise ValueError("valid applies to cu_seqlens only")
            length = as_lengths(lengths)
        else:
            length = _segment_lengths(cu_seqlens, valid)
        flops = float(self.flops_model.per_sample(length, backward=self.backward).sum())
        self.total_flops += flops
        self.tokens += int(length.sum())
        self.samples += int(length.size)
        self.microbatches += 1
        return flops

    def tflops_per_s(self, seconds: float, world_size: int = 1) -> float:
        """Achieved TFLOP/s per GPU: ``total_flops / seconds / world_size / 1e12``."""
        elapsed = check_positive_float(seconds, "seconds")
        ranks = check_int(world_size, "world_size", minimum=1)
        return self.total_flops / elapsed / ranks / 1e12

    def mfu(self, peak_flops_per_s: float, seconds: float, world_size: int = 1) -> float:
        """Model FLOPs utilisation: ``total_flops / (seconds · world_size · peak_flops_per_s)``.

        ``peak_flops_per_s`` is one GPU's peak (e.g. 989e12 for dense BF16 on an H100 SXM).
        """
        peak = check_positive_float(peak_flops_per_s, "peak_flops_per_s")
        return self.tflops_per_s(seconds, world_size) * 1e12 / peak
