"""Hypothesis example counts that scale with the active settings profile.

Profiles (registered in ``conftest.py``; pick one with ``HYPOTHESIS_PROFILE=NAME`` or
``pytest --hypothesis-profile NAME``; otherwise the ``CI`` environment variable selects ``ci``):

- ``dev``: 5% of the full counts, a quick check while editing;
- ``default``: 25% of them, for a local run of the whole suite;
- ``ci``: the same 25%, derandomized so a failure reproduces; it keeps the suite within about
  3 minutes on a 2-core runner;
- ``full``: the full counts written in the tests (``examples(3500)`` runs 3500 examples,
  derandomized), the longer profile behind the figures the issues ask for (e.g. >= 10,000
  validated plans): ``HYPOTHESIS_PROFILE=full python -m pytest -q -n 2``;
- ``long``: 30x the full counts (3000 examples per test without a count, e.g. the adversarial
  planner suite), for adversarial searches before a release.

A test asks for ``examples(n)``, ``n`` being its count under ``full`` (at least ``FEWEST`` under
any profile); tests without an explicit count get the profile's ``max_examples``
(``SCALES[profile] x 100``: 5, 25, 25, 100, 3000).
"""

from __future__ import annotations

import os

from hypothesis import settings

SCALES = {"dev": 0.05, "default": 0.25, "ci": 0.25, "full": 1.0, "long": 30.0}
"""Examples per test relative to the full count, per profile."""

DERANDOMIZED = ("ci", "full")
"""Profiles whose examples are the same on every run (a failure reproduces)."""

FEWEST = 10
"""No test that asks for ``examples(n)`` runs fewer examples than this, whatever the profile."""


def active_profile() -> str:
    """``HYPOTHESIS_PROFILE`` when set, else ``ci`` when the ``CI`` environment variable is set,
    else ``default``."""
    return os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default")


def examples(full_count: int) -> int:
    """Examples for a test that runs ``full_count`` of them under the ``full`` profile.

    Scales with the loaded profile's ``max_examples`` (100 under ``full``), so a profile chosen
    on the command line (``--hypothesis-profile``) applies too.
    """
    return max(FEWEST, round(full_count * settings.default.max_examples / 100))
