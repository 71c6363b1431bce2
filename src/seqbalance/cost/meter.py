"""FlopsMeter: accumulate the model FLOPs of micro-batches, then report TFLOP/s, tokens/s and MFU.

The meter counts what one data-parallel replica trains on: add the micro-batches of a replica
(every rank of a tensor-, pipeline- or context-parallel group adds the same ones: they all work
on the same samples). A report then needs the sum over the data-parallel replicas, which is
either the meter's own total (one process added every replica's micro-batches; pass
``dp_size``) or a total reduced across the data-parallel group (the torch runtime's
:class:`~seqbalance.runtime.flops.TorchFlopsMeter` does that and calls :meth:`FlopsMeter.report`
with it). TFLOP/s per GPU is that total over ``seconds x dp x tp x pp x cp`` GPUs: the number
that is true for the whole job.

Conventions (as Megatron-Bridge's FLOPs accounting, ``training/utils/flop_utils.py``):

* packed micro-batches: ``cu_seqlens_unpadded`` (the real sub-sequence boundaries when every
  sub-sequence is padded, e.g. to a multiple of the context-parallel size) is preferred over
  ``cu_seqlens``; either is read up to its ``*_argmin`` / ``valid`` entries.
* a ``cu_seqlens`` without any sub-sequence (fewer than two entries, e.g. a dense batch) falls
  back to ``micro_batch_size`` sequences of the configured ``seq_length`` tokens; with no
  ``seq_length`` it is an error.
* interleaved (virtual) pipeline parallelism runs the forward step once per model chunk for the
  same micro-batch: only virtual stage 0 (or None) counts.

Unlike Megatron-Bridge, whose linear (projection, MLP, logit) term counts the padded pack
length, every term here counts the real tokens only: padding is not model work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_int, check_positive_float
from seqbalance.cost.flops import FlopsModel, segment_lengths
from seqbalance.cost.hstu import HSTUFlopsModel
from seqbalance.cost.samples import SampleParts
from seqbalance.cost.vision import VisionLanguageFlopsModel

__all__ = ["FlopsMeter", "FlopsReport", "MeterTotals"]

_FLOPS_MODELS = (FlopsModel, VisionLanguageFlopsModel, HSTUFlopsModel)


@dataclass(frozen=True)
class MeterTotals:
    """What a meter accumulated: FLOPs, tokens and samples (of one replica, or summed)."""

    flops: float
    tokens: int
    samples: int


@dataclass(frozen=True)
class FlopsReport:
    """Throughput of one logging interval, for the whole job.

    ``total_flops``, ``tokens`` and ``samples`` are summed over the ``dp_size`` data-parallel
    replicas, each replica counted once (not once per GPU). ``num_gpus`` = ``dp_size x
    tensor_parallel x pipeline_parallel x context_parallel``; ``tflops_per_gpu`` =
    ``total_flops / seconds / num_gpus / 1e12``; ``tokens_per_s`` = ``tokens / seconds`` (whole
    job); ``mfu`` = ``tflops_per_gpu`` over one GPU's peak (None when no peak was given).
    """

    total_flops: float
    tokens: int
    samples: int
    seconds: float
    dp_size: int
    tensor_parallel: int
    pipeline_parallel: int
    context_parallel: int
    num_gpus: int
    tflops_per_gpu: float
    tokens_per_s: float
    mfu: float | None


class FlopsMeter:
    """Running total of model FLOPs (training by default), tokens and samples of micro-batches.

    Args:
        flops_model: A :class:`~seqbalance.cost.flops.FlopsModel`,
            :class:`~seqbalance.cost.vision.VisionLanguageFlopsModel` or
            :class:`~seqbalance.cost.hstu.HSTUFlopsModel`.
        backward: Count forward + backward (3x forward, 4x with the model's ``recompute``;
            default) or forward only (inference).
        tensor_parallel: Tensor-parallel size: GPUs that share each replica's layers.
        pipeline_parallel: Pipeline-parallel size (stages per replica).
        context_parallel: Context-parallel size (GPUs that share each replica's sequences).
        seq_length: Tokens per sequence of a dense (unpacked) micro-batch, for the fallback of a
            ``cu_seqlens`` without sub-sequences; None: such a micro-batch is an error.
        micro_batch_size: Sequences per dense micro-batch (with ``seq_length``).
        peak_flops_per_s: One GPU's peak FLOP/s for MFU (e.g. 989e12 for dense BF16 on an H100
            SXM); None: no MFU.
    """

    def __init__(
        self,
        flops_model: Any,
        *,
        backward: bool = True,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        context_parallel: int = 1,
        seq_length: int | None = None,
        micro_batch_size: int = 1,
        peak_flops_per_s: float | None = None,
    ) -> None:
        if not isinstance(flops_model, _FLOPS_MODELS):
            names = ", ".join(cls.__name__ for cls in _FLOPS_MODELS)
            raise ValueError(
                f"flops_model must be a FLOPs model ({names}), got {type(flops_model).__name__}"
            )
        self.flops_model = flops_model
        self.backward = check_bool(backward, "backward")
        self.tensor_parallel = check_int(tensor_parallel, "tensor_parallel", minimum=1)
        self.pipeline_parallel = check_int(pipeline_parallel, "pipeline_parallel", minimum=1)
        self.context_parallel = check_int(context_parallel, "context_parallel", minimum=1)
        self.seq_length = (
            None if seq_length is None else check_int(seq_length, "seq_length", minimum=1)
        )
        self.micro_batch_size = check_int(micro_batch_size, "micro_batch_size", minimum=1)
        self.peak_flops_per_s = (
            None
            if peak_flops_per_s is None
            else check_positive_float(peak_flops_per_s, "peak_flops_per_s")
        )
        self.reset()

    @property
    def model_parallel_size(self) -> int:
        """GPUs per data-parallel replica: ``tensor_parallel x pipeline_parallel x
        context_parallel``."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    @property
    def totals(self) -> MeterTotals:
        """FLOPs, tokens and samples added since the last reset."""
        return MeterTotals(self.total_flops, self.tokens, self.samples)

    def reset(self) -> None:
        """Forget everything added so far."""
        self.total_flops = 0.0
        self.tokens = 0
        self.samples = 0
        self.microbatches = 0

    def add(
        self,
        lengths: Any = None,
        *,
        cu_seqlens: Any = None,
        valid: int | None = None,
        cu_seqlens_unpadded: Any = None,
        valid_unpadded: int | None = None,
        parts: SampleParts | None = None,
        vp_stage: int | None = None,
    ) -> float:
        """Add one micro-batch; return its FLOPs (0.0 for a virtual stage other than 0).

        Give exactly one of ``lengths`` (tokens per sample), the packed boundaries
        (``cu_seqlens`` and/or ``cu_seqlens_unpadded``: 1-D, starting at 0, non-decreasing;
        the unpadded ones are used when given) or ``parts``
        (:class:`~seqbalance.cost.samples.SampleParts`, for models that take them). ``valid``
        and ``valid_unpadded`` are the numbers of leading valid entries of each array (Megatron's
        ``cu_seqlens_argmin`` and ``cu_seqlens_unpadded_argmin``; the rest is padding). A
        ``cu_seqlens`` with fewer than two valid entries holds no sub-sequence and counts
        ``micro_batch_size`` sequences of ``seq_length`` tokens (ValueError without
        ``seq_length``). ``vp_stage``: the virtual pipeline stage of this forward step; stages
        other than None and 0 count nothing, as every chunk of an interleaved schedule sees the
        same micro-batch.
        """
        if vp_stage is not None and check_int(vp_stage, "vp_stage", minimum=0) > 0:
            return 0.0
        packed = cu_seqlens is not None or cu_seqlens_unpadded is not None
        if sum((lengths is not None, packed, parts is not None)) != 1:
            raise ValueError(
                "give exactly one of lengths, cu_seqlens (or cu_seqlens_unpadded), parts"
            )
        if cu_seqlens is None and valid is not None:
            raise ValueError("valid applies to cu_seqlens only")
        if cu_seqlens_unpadded is None and valid_unpadded is not None:
            raise ValueError("valid_unpadded applies to cu_seqlens_unpadded only")
        if parts is not None:
            if not getattr(self.flops_model, "accepts_parts", False):
                raise ValueError(
                    f"{type(self.flops_model).__name__} does not take SampleParts; add lengths"
                )
            if not isinstance(parts, SampleParts):
                raise ValueError(f"parts must be a SampleParts, got {type(parts).__name__}")
            samples: Any = parts
            length = parts.tokens
        else:
            if packed:
                length = self._packed_lengths(
                    cu_seqlens, valid, cu_seqlens_unpadded, valid_unpadded
                )
            else:
                length = as_lengths(lengths)
            samples = length
        flops = float(self.flops_model.per_sample(samples, backward=self.backward).sum())
        self.total_flops += flops
        self.tokens += int(length.sum())
        self.samples += int(length.size)
        self.microbatches += 1
        return flops

    def _packed_lengths(
        self, cu_seqlens: Any, valid: Any, cu_seqlens_unpadded: Any, valid_unpadded: Any
    ) -> np.ndarray:
        if cu_seqlens_unpadded is not None:
            entries, count, name = cu_seqlens_unpadded, valid_unpadded, "cu_seqlens_unpadded"
        else:
            entries, count, name = cu_seqlens, valid, "cu_seqlens"
        if np.ndim(entries) != 1:
            raise ValueError(f"{name} must be a 1-D array, got shape {np.shape(entries)}")
        size = np.shape(entries)[0]
        if count is not None:
            label = "valid" if name == "cu_seqlens" else "valid_unpadded"
            count = check_int(count, label, minimum=0)
            if count > size:
                raise ValueError(f"{label} = {count} exceeds the {size} entries of {name}")
        if (size if count is None else count) < 2:
            if self.seq_length is None:
                raise ValueError(
                    f"{name} holds no sub-sequence (fewer than two valid entries); configure "
                    "seq_length (and micro_batch_size) for the dense fallback"
                )
            return np.full(self.micro_batch_size, self.seq_length, dtype=np.int64)
        return segment_lengths(entries, count)

    def report(
        self, seconds: float, *, dp_size: int = 1, totals: MeterTotals | None = None
    ) -> FlopsReport:
        """Throughput of the interval of ``seconds`` for the whole job.

        Args:
            seconds: Wall-clock length of the interval.
            dp_size: Data-parallel replicas whose micro-batches ``totals`` sums.
            totals: The totals summed over the ``dp_size`` replicas; default: this meter's own
                (one process added every replica's micro-batches, or ``dp_size`` = 1).
        """
        elapsed = check_positive_float(seconds, "seconds")
        replicas = check_int(dp_size, "dp_size", minimum=1)
        summed = self.totals if totals is None else totals
        if not isinstance(summed, MeterTotals):
            raise ValueError(f"totals must be MeterTotals, got {type(summed).__name__}")
        gpus = replicas * self.model_parallel_size
        tflops = summed.flops / elapsed / gpus / 1e12
        return FlopsReport(
            total_flops=summed.flops,
            tokens=summed.tokens,
            samples=summed.samples,
            seconds=elapsed,
            dp_size=replicas,
            tensor_parallel=self.tensor_parallel,
            pipeline_parallel=self.pipeline_parallel,
            context_parallel=self.context_parallel,
            num_gpus=gpus,
            tflops_per_gpu=tflops,
            tokens_per_s=summed.tokens / elapsed,
            mfu=None if self.peak_flops_per_s is None else tflops * 1e12 / self.peak_flops_per_s,
        )
