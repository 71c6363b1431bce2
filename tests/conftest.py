"""Test configuration: hypothesis profiles (see ``_profiles.py``; derandomized in CI so a
failure reproduces)."""

from _profiles import SCALES, active_profile
from hypothesis import HealthCheck, settings

for _name, _scale in SCALES.items():
    settings.register_profile(
        _name,
        max_examples=round(100 * _scale),
        deadline=None,
        derandomize=_name == "ci",
        print_blob=_name == "ci",
        suppress_health_check=[HealthCheck.too_slow],
    )
settings.load_profile(active_profile())
