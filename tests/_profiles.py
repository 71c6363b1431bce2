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
(``SCALES[profile] x 100``: 5, 25, 25, 100, 3000). A test with dear examples asks for fewer under
``ci`` and ``default`` with ``examples(n, quick=q)`` (see :func:`examples`).
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


def examples(full_count: int, *, quick: int | None = None) -> int:
    """Examples for a test that runs ``full_count`` of them under the ``full`` profile.

    Scales with the loaded profile's ``max_examples`` (100 under ``full``), so a profile chosen
    on the command line (``--hypothesis-profile``) applies too.

    Args:
        full_count: The test's examples under ``full`` (30 times as many under ``long``).
        quick: The test's examples under ``ci`` and ``default`` where fewer than their share of
            ``full_count``, for a test whose examples are dear (``dev`` runs a fifth of it;
            ``full`` and ``long`` are unchanged). Set only where that many examples reach every
            line and branch of the package that the share reached (``coverage run --branch``
            under ``ci``, the examples derandomized): the suite's time goes to the searches the
            ``full`` and ``long`` profiles make, not to the quick ones.
    """
    scale = settings.default.max_examples / 100
    if quick is None or scale > SCALES["ci"]:
        return max(FEWEST, round(full_count * scale))
    if quick >= full_count * SCALES["ci"]:
        raise ValueError(f"quick must be below {SCALES['ci']:.0%} of full_count, got {quick}")
    return max(FEWEST, round(quick * scale / SCALES["ci"]))
