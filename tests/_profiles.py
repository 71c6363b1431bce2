"""Hypothesis example counts that scale with the active settings profile.

Profiles (registered in ``conftest.py``; pick one with ``HYPOTHESIS_PROFILE=NAME`` or
``pytest --hypothesis-profile NAME``; the ``CI`` environment variable selects ``ci``):

- ``dev``: 5% of the CI counts, a quick check while editing;
- ``default``: 25% of them, for a local run of the whole suite;
- ``ci``: the full counts written in the tests (``examples(3500)`` runs 3500 examples);
- ``long``: 30x the CI counts (3000 examples per test without a count, e.g. the adversarial
  planner suite), for adversarial searches before a release.

A test asks for ``examples(n)``, ``n`` being its count under ``ci`` (at least ``FEWEST`` under
any profile); tests without an explicit count get the profile's ``max_examples``
(``SCALES[profile] x 100``: 5, 25, 100, 3000).
"""

from __future__ import annotations

import os

from hypothesis import settings

SCALES = {"dev": 0.05, "default": 0.25, "ci": 1.0, "long": 30.0}
"""Examples per test relative to the CI count, per profile."""

FEWEST = 10
"""No test that asks for ``examples(n)`` runs fewer examples than this, whatever the profile."""


def active_profile() -> str:
    """``ci`` when the ``CI`` environment variable is set, else ``HYPOTHESIS_PROFILE`` or
    ``default``."""
    return "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "default")


def examples(ci_count: int) -> int:
    """Examples for a test that runs ``ci_count`` of them under the ``ci`` profile.

    Scales with the loaded profile's ``max_examples`` (100 under ``ci``), so a profile chosen
    on the command line (``--hypothesis-profile``) applies too.
    """
    return max(FEWEST, round(ci_count * settings.default.max_examples / 100))
