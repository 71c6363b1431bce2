"""Adversarial (adv14d D6): the length generators returned negative or zero token counts
without a word: caps beyond int64's reach (``long_context(10, long_min=1, long_max=2**63 - 1,
short_median=1e300)`` gave -2**63 tokens each; ``rl_lengths`` with such caps 0 or -2**63) and
log-sds whose product overflowed to ``inf - inf`` (``rl_lengths(50, group_sigma=1e308,
response_sigma=1e308)``: NaN draws cast to -2**63)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from seqbalance.datasets import long_context, rl_lengths


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: long_context(10, long_min=1, long_max=2**63 - 1, short_median=1e300), "long_max"),
        (lambda: long_context(10, long_min=2**60, long_max=2**61), "long_min"),
        (lambda: long_context(10, short_sigma=1e308), "short_sigma"),
        (lambda: rl_lengths(3, max_prompt_length=2**63 - 1), "max_prompt_length"),
        (lambda: rl_lengths(3, max_response_length=2**62), "max_response_length"),
        (lambda: rl_lengths(50, group_sigma=1e308, response_sigma=1e308), "response_sigma"),
        (lambda: rl_lengths(50, group_sigma=1e308), "group_sigma"),
        (lambda: rl_lengths(50, response_sigma=101.0), "response_sigma"),
        (lambda: rl_lengths(50, prompt_sigma=1e200), "prompt_sigma"),
        # adv19a F3: numpy's "Maximum allowed dimension exceeded" (naming nothing) or an
        # OverflowError; float(10**400) overflowed before the range check of long_fraction.
        (lambda: rl_lengths(2**60, group_size=2**10), "n_prompts x group_size"),
        (lambda: rl_lengths(1, group_size=2**70), "n_prompts x group_size"),
        (lambda: long_context(2**54), "n"),
    ],
)
def test_arguments_beyond_the_limits_are_named(make, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be <="):
        make()


def test_a_fraction_beyond_float_is_refused_by_range() -> None:
    with pytest.raises(ValueError, match=r"^long_fraction must be in \[0, 1\], got 1000"):
        long_context(10, long_fraction=10**400)


def test_extremes_within_the_limits_stay_within_the_caps_quietly() -> None:
    extremes = {
        "prompt_median": 1e300,
        "response_median": 1e-300,
        "group_sigma": 100.0,
        "response_sigma": 100.0,
        "max_prompt_length": 2**53,
        "max_response_length": 2**53,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warnings are errors here
        lengths, _ = rl_lengths(50, **extremes)
        short = long_context(50, short_median=1e300, short_sigma=100.0, long_max=2**53)
    assert lengths.min() >= 2 and lengths.max() <= 2**54
    assert short.min() >= 1 and short.max() <= 2**53
    assert np.array_equal(lengths, rl_lengths(50, **extremes)[0])  # the same draws again
