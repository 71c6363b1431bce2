"""``launch`` given arguments it cannot use: a lambda or an unpicklable argument failed at the
first process start with pickle's PicklingError / TypeError, a string as ``args`` was spread
into one argument per character without a word, and a ``log_dir`` naming a file raised
FileExistsError: each is a ValueError naming the argument now, before any process starts
(adv11b U10)."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from seqbalance.measure.launch import launch  # noqa: E402


@pytest.mark.parametrize(
    ("fn", "kwargs", "name"),
    [
        (lambda rank, world: rank, {}, "fn"),
        (print, {"args": (threading.Lock(),)}, "args"),
        (print, {"args": "abc"}, "args"),
        (print, {"log_dir": __file__}, "log_dir"),
        (print, {"poll": 5}, "poll"),  # adv15b: TypeError once the ranks ran
    ],
    ids=["lambda", "lock", "string", "file", "poll"],
)
def test_refused_before_a_process_starts(fn, kwargs, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        launch(fn, 1, **kwargs)
