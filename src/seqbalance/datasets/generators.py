"""Parametric length generators for workloads without a bundled set: RL rollouts, long context.

Both are deterministic per ``seed`` (``numpy.random.default_rng``) and return int64 token counts.
"""

from __future__ import annotations

import numbers

import numpy as np

from seqbalance._validation import (
    MAX_TOKENS_LIMIT,
    check_bounded_count,
    check_int,
    check_non_negative_float,
    check_positive_float,
)

__all__ = ["long_context", "rl_lengths"]

_MAX_SAMPLES = 2**53
"""Most samples a generator draws (numpy refused more naming no argument: "Maximum allowed
dimension exceeded", or OverflowError)."""

_MAX_SIGMA = 100.0
"""Largest log-sd accepted (natural log): ``e**100`` tokens is a spread no length mix has, and
two larger ones can sum to ``inf - inf`` (NaN draws, cast to -2**63 tokens without a word)."""


def _lognormal_tokens(
    rng: np.random.Generator, median: float, log_offsets: np.ndarray, sigma: float, cap: int
) -> np.ndarray:
    """Round(median * exp(offset + sigma * z)) clipped to [1, cap] tokens."""
    with np.errstate(over="ignore", under="ignore"):  # inf is clipped to cap, 0 to 1: exact
        draws = median * np.exp(log_offsets + sigma * rng.standard_normal(log_offsets.shape))
    return np.clip(np.rint(draws), 1, cap).astype(np.int64)


def _sigma(value: float, name: str) -> float:
    """A log-normal's sd (of log tokens) within ``_MAX_SIGMA``: beyond it draws overflow."""
    sigma = check_non_negative_float(value, name)
    if sigma > _MAX_SIGMA:
        raise ValueError(f"{name} must be <= {_MAX_SIGMA:g} (a log-sd), got {value!r}")
    return sigma


def _tokens(value: int, name: str) -> int:
    """A token count of at least 1 and at most 2**53 (beyond it float64 draws are not whole
    counts and int64 sums overflow: 2**63 - 1 came back as -2**63)."""
    tokens = check_int(value, name, minimum=1)
    if tokens > MAX_TOKENS_LIMIT:
        raise ValueError(f"{name} must be <= 2**53 = {MAX_TOKENS_LIMIT}, got {tokens}")
    return tokens


def rl_lengths(
    n_prompts: int,
    *,
    group_size: int = 8,
    prompt_median: float = 200.0,
    prompt_sigma: float = 0.5,
    max_prompt_length: int = 1024,
    response_median: float = 1200.0,
    response_sigma: float = 0.7,
    group_sigma: float = 0.5,
    max_response_length: int = 4096,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Sequence lengths of a GRPO-style rollout batch: ``n_prompts`` groups of ``group_size``.

    Each sample is prompt + response tokens. Prompts are lognormal (``prompt_median`` tokens,
    log-sd ``prompt_sigma``, truncated to ``max_prompt_length``) and shared by the samples of a
    group. Responses are lognormal around a per-prompt median (log-sd ``group_sigma`` across
    prompts: hard prompts make every response long) with log-sd ``response_sigma`` within a group,
    and are cut at ``max_response_length``: truncated rollouts pile up at the cap, the spike seen
    in real GRPO runs (about 8% of samples with the defaults).

    Returns ``(lengths, groups)``: int64 tokens per sample and int64 group (prompt) id per
    sample, ``groups == arange(n_prompts).repeat(group_size)``. Log-sds are at most 100 and
    length caps at most 2**53 tokens (ValueError naming the argument).
    """
    n_prompts = check_int(n_prompts, "n_prompts", minimum=1)
    group_size = check_int(group_size, "group_size", minimum=1)
    if n_prompts * group_size > _MAX_SAMPLES:  # numpy's unnamed refusal, or OverflowError
        raise ValueError(
            f"n_prompts x group_size must be <= 2**53 = {_MAX_SAMPLES} samples, got "
            f"{n_prompts} x {group_size}"
        )
    prompt_median = check_positive_float(prompt_median, "prompt_median")
    response_median = check_positive_float(response_median, "response_median")
    prompt_sigma = _sigma(prompt_sigma, "prompt_sigma")
    response_sigma = _sigma(response_sigma, "response_sigma")
    group_sigma = _sigma(group_sigma, "group_sigma")
    max_prompt_length = _tokens(max_prompt_length, "max_prompt_length")
    max_response_length = _tokens(max_response_length, "max_response_length")
    seed = check_int(seed, "seed", minimum=0)

    rng = np.random.default_rng(seed)
    prompts = _lognormal_tokens(
        rng, prompt_median, np.zeros(n_prompts), prompt_sigma, max_prompt_length
    )
    difficulty = group_sigma * rng.standard_normal(n_prompts)
    responses = _lognormal_tokens(
        rng, response_median, np.repeat(difficulty, group_size), response_sigma, max_response_length
    )
    groups = np.repeat(np.arange(n_prompts, dtype=np.int64), group_size)
    return prompts[groups] + responses, groups


def long_context(
    n: int,
    *,
    short_median: float = 2048.0,
    short_sigma: float = 1.0,
    long_fraction: float = 0.1,
    long_min: int = 32768,
    long_max: int = 131072,
    seed: int = 0,
) -> np.ndarray:
    """Token lengths of a long-context mix: mostly short documents, a few very long ones.

    ``round(long_fraction * n)`` documents are log-uniform in ``[long_min, long_max]`` tokens
    (e.g. 32k-128k books and repositories), at random positions; the others are lognormal
    (``short_median`` tokens, log-sd ``short_sigma``) clipped to ``[1, long_max]``.
    Returns int64 tokens per document. ``short_sigma`` is at most 100 and ``long_max`` at most
    2**53 tokens (ValueError naming the argument).
    """
    n = check_bounded_count(n, "n", most=_MAX_SAMPLES, unit=" samples")
    short_median = check_positive_float(short_median, "short_median")
    short_sigma = _sigma(short_sigma, "short_sigma")
    if isinstance(long_fraction, (bool, np.bool_)) or not isinstance(long_fraction, numbers.Real):
        raise ValueError(f"long_fraction must be a number in [0, 1], got {long_fraction!r}")
    if not 0 <= long_fraction <= 1:  # compared as given: float(10**400) overflowed
        raise ValueError(f"long_fraction must be in [0, 1], got {long_fraction!r}")
    long_min = _tokens(long_min, "long_min")
    long_max = _tokens(long_max, "long_max")
    if long_min > long_max:
        raise ValueError(f"long_min ({long_min}) must be <= long_max ({long_max})")
    seed = check_int(seed, "seed", minimum=0)

    rng = np.random.default_rng(seed)
    lengths = _lognormal_tokens(rng, short_median, np.zeros(n), short_sigma, long_max)
    n_long = round(float(long_fraction) * n)
    positions = rng.permutation(n)[:n_long]
    log_long = rng.uniform(np.log(long_min), np.log(long_max), size=n_long)
    lengths[positions] = np.clip(np.rint(np.exp(log_long)), long_min, long_max).astype(np.int64)
    return lengths
