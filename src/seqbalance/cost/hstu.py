"""HSTU (generative recommendation) cost model: per-sample FLOPs of a stack of HSTU layers.

An HSTU layer (Zhai et al. 2024; facebookresearch/generative-recommenders ``STULayer``,
NVIDIA/recsys-examples ``HSTULayer``) on a sequence of ``N`` tokens of width ``E``
(``hidden_size``) with ``H`` heads:

* one projection ``E -> H·(2·Dl + 2·Da)`` gives four tensors per token: U and V (``linear_dim``
  ``Dl`` per head) and Q and K (``attention_dim`` ``Da`` per head). ``Da`` need not equal
  ``E / H``.
* pointwise attention: ``SiLU(QKᵀ)/N`` masked, times V: ``2·H·Da`` FLOPs for QKᵀ plus
  ``2·H·Dl`` for AV per *valid* query–key pair (no softmax; the fused kernels skip the masked
  tiles).
* output: ``U ⊙ norm(AV)`` (recsys-examples), or ``[U, AV, U ⊙ norm(AV)]`` when
  ``concat_ux`` (generative-recommenders), projected back to ``E``: ``H·Dl·E`` weights (x3 with
  ``concat_ux``).

Per token and layer that is ``2·E·H·(2·Dl + 2·Da) + 2·k·H·Dl·E`` FLOPs (``k`` = 1 or 3), plus
``2·H·(Da + Dl)`` per valid pair. Norms, SiLU, the elementwise products and the residual add are
not counted (not matmuls). Embedding lookups, the optional input MLPs and the ranking head are
outside the HSTU stack and not counted either.

**The sequence.** A sample is ``c`` contextual-feature tokens (prepended), the user's history
of ``h`` items and ``t`` candidate items (appended). With action interleaving (the training
preprocessors put each item's action embedding after it) every item becomes two tokens, so the
model runs ``N = c + 2·(h + t)`` tokens, of which ``2·t`` are candidate tokens; without,
``N = c + h + t``.

**The mask (causal, the kernels' "context + causal + target" mask).** With ``h'`` history and
``t'`` candidate tokens after interleaving:

* each contextual token sees every contextual and history token: ``c·(c + h')`` pairs;
* history token ``j`` (1-based) sees the ``c`` contextual tokens and history tokens ``1..j``:
  ``h'·c + h'(h'+1)/2`` pairs;
* each candidate token sees the contextual and history tokens and itself, not the other
  candidates: ``t'·(c + h' + 1)`` pairs.

With ``causal=False`` (the kernels' "no mask" mode; their contextual and target masks exist
only together with the causal mask) every token sees every token: ``N²`` pairs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_int
from seqbalance.cost._hf_config import read_json
from seqbalance.cost.samples import SampleParts

__all__ = ["HSTUFlopsModel", "HSTUSpec", "hstu_attention_pairs", "hstu_presets"]

_PRESET_PACKAGE = "seqbalance.cost"
_PRESET_FOLDER = ("presets", "hstu")
_FORMAT = "seqbalance.hstu/1"
_SIZE_FIELDS = ("num_layers", "hidden_size", "num_heads", "attention_dim", "linear_dim")


def _preset_folder() -> Any:
    return resources.files(_PRESET_PACKAGE).joinpath(*_PRESET_FOLDER)


def hstu_presets() -> list[str]:
    """Names of the bundled HSTU presets (``seqbalance.hstu/1`` JSON files), sorted."""
    files = _preset_folder().iterdir()
    return sorted(f.name[: -len(".json")] for f in files if f.name.endswith(".json"))


@dataclass(frozen=True, kw_only=True)
class HSTUSpec:
    """Shape of an HSTU stack, as far as FLOPs are concerned (see the module docstring).

    Args:
        num_layers: HSTU layers.
        hidden_size: ``E``, the embedding width between layers.
        num_heads: ``H``.
        attention_dim: ``Da``, width of one head's Q and K (recsys-examples: ``kv_channels``).
        linear_dim: ``Dl``, width of one head's U and V (recsys-examples: ``kv_channels`` too).
        concat_ux: The output projection reads ``[U, AV, U ⊙ norm(AV)]`` (``3·H·Dl`` wide,
            generative-recommenders' ``STULayer``) instead of ``U ⊙ norm(AV)`` (``H·Dl``,
            recsys-examples' ``HSTULayer``).
        name: A label for reports.

    A spec is stored as a ``seqbalance.hstu/1`` JSON object: ``{"format": "seqbalance.hstu/1",
    "name": ..., "num_layers": ..., "hidden_size": ..., "num_heads": ..., "attention_dim": ...,
    "linear_dim": ..., "concat_ux": ..., "source": "where the numbers come from"}``
    (:meth:`from_config`, :meth:`to_dict`); ``source`` is documentation and optional.
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    attention_dim: int
    linear_dim: int
    concat_ux: bool = False
    name: str = "custom"

    def __post_init__(self) -> None:
        for attribute in _SIZE_FIELDS:
            object.__setattr__(
                self, attribute, check_int(getattr(self, attribute), attribute, minimum=1)
            )
        object.__setattr__(self, "concat_ux", check_bool(self.concat_ux, "concat_ux"))
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")

    def num_parameters(self) -> int:
        """Matmul weights of the stack (projections of every layer; biases and norms not
        counted)."""
        return self.num_layers * (self._projection_weights() + self._output_weights())

    def _projection_weights(self) -> int:
        return self.hidden_size * self.num_heads * (2 * self.linear_dim + 2 * self.attention_dim)

    def _output_weights(self) -> int:
        return (3 if self.concat_ux else 1) * self.num_heads * self.linear_dim * self.hidden_size

    @classmethod
    def preset(cls, name: str) -> HSTUSpec:
        """The bundled spec ``name`` (see :func:`hstu_presets`)."""
        available = hstu_presets()
        if name not in available:
            raise ValueError(f"unknown HSTU preset {name!r}; available: {', '.join(available)}")
        text = _preset_folder().joinpath(f"{name}.json").read_text("utf-8")
        return cls.from_config(json.loads(text))

    @classmethod
    def from_config(cls, config: str | Path | Mapping[str, Any]) -> HSTUSpec:
        """A spec from a ``seqbalance.hstu/1`` JSON object (a dict, or a path to the file).

        Raises:
            ValueError: another ``format``, an unknown key, or a missing or bad field (named).
        """
        if isinstance(config, (str, Path)):
            config = read_json(config)
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a path or a mapping, got {type(config).__name__}")
        if config.get("format") != _FORMAT:
            raise ValueError(f"config['format'] must be {_FORMAT!r}, got {config.get('format')!r}")
        allowed = {"format", "source", *_SIZE_FIELDS, "concat_ux", "name"}
        unknown = sorted(set(config) - allowed)
        if unknown:
            raise ValueError(f"unknown HSTU config field(s): {', '.join(unknown)}")
        missing = [key for key in _SIZE_FIELDS if key not in config]
        if missing:
            raise ValueError(f"config field {missing[0]!r} is missing (it changes the FLOPs)")
        values = {k: v for k, v in config.items() if k not in ("format", "source")}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a ``seqbalance.hstu/1`` JSON-ready dict (without ``source``)."""
        return {"format": _FORMAT, **asdict(self)}


def hstu_attention_pairs(
    history_tokens: Any,
    candidate_tokens: Any = None,
    contextual: Any = None,
    *,
    causal: bool = True,
) -> np.ndarray:
    """Valid query–key pairs (float64) per sequence under the HSTU mask (module docstring).

    Counts are tokens of the sequence as the model runs it, i.e. after action interleaving:
    ``history_tokens`` (``h'``), ``candidate_tokens`` (``t'``, default 0) and ``contextual``
    (``c``, default 0). Causal: ``c(c + h') + h'c + h'(h'+1)/2 + t'(c + h' + 1)``; otherwise
    ``N²`` with ``N = c + h' + t'``.
    """
    history = as_lengths(history_tokens, "history_tokens").astype(np.float64)
    n = history.size
    candidates = _optional_counts(candidate_tokens, "candidate_tokens", n).astype(np.float64)
    context = _optional_counts(contextual, "contextual", n).astype(np.float64)
    if not check_bool(causal, "causal"):
        return (context + history + candidates) ** 2
    return (
        context * (context + history)
        + history * context
        + history * (history + 1.0) / 2.0
        + candidates * (context + history + 1.0)
    )


def _optional_counts(values: Any, name: str, n: int) -> np.ndarray:
    if values is None:
        return np.zeros(n, dtype=np.int64)
    array = as_lengths(values, name)
    if array.size != n:
        raise ValueError(f"{name} must hold one value per sequence ({n}), got {array.size}")
    return array


class HSTUFlopsModel:
    """FLOPs per sample of an HSTU stack (see the module docstring for what is counted).

    Satisfies the cost protocol (``per_sample``, ``microbatch_overhead``, ``unit``) and accepts
    :class:`~seqbalance.cost.samples.SampleParts` with HSTU fields (``accepts_parts``). A plain
    lengths array means sequences of that many tokens, all history (as the model runs them:
    already interleaved), no candidates and no contextual features.

    Args:
        spec: The stack's shape, or an HSTU preset name (e.g. ``"hstu-1024"``).
        causal: The causal mask with contextual and candidate handling (default), or no mask.
        action_interleaved: Each history and candidate item is two tokens (item, action), as in
            the recsys-examples training preprocessor; False: one token per item.
        recompute: Training counts one extra forward (activation recomputation): 4x, not 3x.
    """

    accepts_parts: ClassVar[bool] = True
    unit: ClassVar[str] = "FLOPs"

    def __init__(
        self,
        spec: HSTUSpec | str,
        *,
        causal: bool = True,
        action_interleaved: bool = True,
        recompute: bool = False,
    ) -> None:
        if isinstance(spec, str):
            spec = HSTUSpec.preset(spec)
        if not isinstance(spec, HSTUSpec):
            raise ValueError(f"spec must be an HSTUSpec or a preset name, got {spec!r}")
        self.spec = spec
        self.causal = check_bool(causal, "causal")
        self.action_interleaved = check_bool(action_interleaved, "action_interleaved")
        self.recompute = check_bool(recompute, "recompute")

    def __repr__(self) -> str:
        return (
            f"HSTUFlopsModel({self.spec.name!r}, causal={self.causal}, "
            f"action_interleaved={self.action_interleaved}, recompute={self.recompute})"
        )

    @property
    def token_flops(self) -> float:
        """Forward FLOPs per token, all layers: the UVQK and output projections."""
        return 2.0 * self.spec.num_parameters()

    @property
    def pair_flops(self) -> float:
        """Forward FLOPs per valid query–key pair, all layers: ``2·H·(Da + Dl)`` per layer."""
        spec = self.spec
        return 2.0 * spec.num_layers * spec.num_heads * (spec.attention_dim + spec.linear_dim)

    @property
    def training_multiplier(self) -> int:
        """Training FLOPs / forward FLOPs: 3 (forward + backward), 4 with recompute."""
        return 4 if self.recompute else 3

    @property
    def microbatch_overhead(self) -> float:
        """FLOPs a micro-batch costs regardless of its samples: 0."""
        return 0.0

    @property
    def tokens_per_item(self) -> int:
        """Tokens per history or candidate item: 2 with action interleaving, else 1."""
        return 2 if self.action_interleaved else 1

    def sequence_lengths(
        self, history: Any, candidates: Any = None, contextual: Any = None
    ) -> np.ndarray:
        """``[n]`` tokens the stack runs per sample: ``c + tokens_per_item·(h + t)`` (int64)."""
        items = as_lengths(history, "history")
        extra = _optional_counts(candidates, "candidates", items.size)
        context = _optional_counts(contextual, "contextual", items.size)
        return context + self.tokens_per_item * (items + extra)

    def parts(self, history: Any, candidates: Any = None, contextual: Any = None) -> SampleParts:
        """:class:`SampleParts` of HSTU samples, ``tokens`` set to :meth:`sequence_lengths`."""
        return SampleParts(
            tokens=self.sequence_lengths(history, candidates, contextual),
            history=history,
            candidates=candidates,
            contextual=contextual,
        )

    def attention_pairs(self, lengths_or_parts: Any) -> np.ndarray:
        """Valid query–key pairs (float64) per sample, one layer and head."""
        if not isinstance(lengths_or_parts, SampleParts):
            return hstu_attention_pairs(lengths_or_parts, causal=self.causal)
        parts = self._checked(lengths_or_parts)
        per_item = self.tokens_per_item
        return hstu_attention_pairs(
            per_item * parts.history,  # type: ignore[operator]
            per_item * parts.candidates,  # type: ignore[operator]
            parts.contextual,
            causal=self.causal,
        )

    def forward(self, lengths_or_parts: Any) -> np.ndarray:
        """Forward FLOPs (float64) per sample."""
        if isinstance(lengths_or_parts, SampleParts):
            tokens = self._checked(lengths_or_parts).tokens
        else:
            tokens = as_lengths(lengths_or_parts)
        return self.token_flops * tokens + self.pair_flops * self.attention_pairs(lengths_or_parts)

    def per_sample(self, lengths_or_parts: Any, backward: bool = True) -> np.ndarray:
        """FLOPs (float64) per sample: training (forward + backward, default) or forward only."""
        multiplier = self.training_multiplier if check_bool(backward, "backward") else 1
        return self.forward(lengths_or_parts) * multiplier

    def _checked(self, parts: SampleParts) -> SampleParts:
        if not parts.has_hstu:
            raise ValueError(
                "parts carry no HSTU fields: give history (and candidates, contextual)"
            )
        if parts.has_images:
            raise ValueError("parts carry images, which an HSTU model has not")
        expected = self.sequence_lengths(parts.history, parts.candidates, parts.contextual)
        wrong = parts.tokens != expected
        if wrong.any():
            bad = int(np.flatnonzero(wrong)[0])
            raise ValueError(
                f"parts.tokens[{bad}] = {int(parts.tokens[bad])}, but its history, candidates and "
                f"contextual make {int(expected[bad])} tokens (action_interleaved="
                f"{self.action_interleaved}); build the parts with HSTUFlopsModel.parts"
            )
        return parts
