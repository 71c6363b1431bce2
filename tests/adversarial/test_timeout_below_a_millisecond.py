"""A deadline between a microsecond and a millisecond passed every check (a timedelta holds it)
but torch.distributed counts deadlines in whole milliseconds: ``launch(...,
collective_timeout=0.0005)`` and ``seqbalance bench --timeout 0.0005`` failed in the launcher's
own store with a 0 ms DistNetworkError and a C++ stack trace (rc 1), not a ValueError naming the
argument (adv11b U9). Every deadline is at least a millisecond now."""

from __future__ import annotations

import pytest

from seqbalance.cli import main

torch = pytest.importorskip("torch")

from seqbalance.measure.launch import launch  # noqa: E402
from seqbalance.runtime import Feedback  # noqa: E402


@pytest.mark.parametrize("name", ["timeout", "collective_timeout"])
def test_the_launcher_refuses_a_deadline_below_a_millisecond(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be at least 0.001 seconds"):
        launch(print, 1, **{name: 0.0005})


def test_bench_refuses_it_in_one_line(capsys) -> None:
    assert main(["bench", "--timeout", "0.0005", "--steps", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "timeout must be at least 0.001 seconds" in lines[0], lines


def test_a_millisecond_is_accepted() -> None:
    assert Feedback(timeout=0.001).timeout == 0.001
