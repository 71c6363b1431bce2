"""Adversarial (adv9b P3; adv8b remark e): ``--slow-rank`` read lenient forms as some spell:
``1:2@5`` (step 5 alone, or from step 5?) ran slow from step 5 to the end, ``1:2@-5`` (a
negative start?) from 0 to 5, ``1:2@`` the whole run, ``1:1_5`` (a typo of 1.5) a factor of 15,
``1_0:2`` rank 10. Now only the documented forms are read (``R:F``, ``R:F@START-STOP``,
``R:F@START-``); any other is one line, rc 2, before any launch."""

from __future__ import annotations

import pytest

from seqbalance.cli import main
from seqbalance.measure.bench import SlowRank


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:1.5", SlowRank(1, 1.5)),
        ("0:2@20-40", SlowRank(0, 2.0, 20, 40)),
        ("3:1.25@5-", SlowRank(3, 1.25, 5, None)),
        (" 1:2.5e0 ", SlowRank(1, 2.5)),
        ("1:2.", SlowRank(1, 2.0)),
    ],
)
def test_documented_forms_are_read(text: str, expected: SlowRank) -> None:
    assert SlowRank.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    ["1:2@", "1:2@5", "1:2@-5", "1:2@-", "1:1_5", "1_0:2", "1 : 2", "+1:2", "１:2", "1:2@٣-9"],
)
def test_other_forms_are_one_line_before_any_launch(text: str, capsys) -> None:
    with pytest.raises(ValueError, match="slow_rank must be R:F or R:F@START-STOP"):
        SlowRank.parse(text)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--slow-rank", text, "--steps", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "slow_rank must be R:F or R:F@START-STOP" in err and "Traceback" not in err


@pytest.mark.parametrize("spell", ["20-30", "20-", "100-200"])
def test_a_spell_after_the_last_measured_step_is_refused(spell: str, capsys) -> None:
    """adv15b D3: ``--slow-rank 1:2@100-200`` with 20 measured steps slowed no step: the run
    compared the closed loop on equal ranks, for minutes, without a word."""
    assert main(["bench", "--slow-rank", f"1:2@{spell}", "--steps", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("seqbalance bench: error: --slow-rank start must be < --steps = 20")
