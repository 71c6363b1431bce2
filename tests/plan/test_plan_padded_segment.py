"""``_padded.segment``: the least largest padded cost of consecutive micro-batches, by a
bisection over the budget of a greedy cut; it stops once a cut is sure to be its last one
(``_Cuts.settled``), with the cut the whole bisection gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import _padded


@st.composite
def _steps(draw: st.DrawFn) -> tuple[SimpleNamespace, np.ndarray, int]:
    n = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, draw(st.sampled_from([8, 600, 8000])), n)
    kind = draw(st.sampled_from(["tokens", "flops", "tiny", "zeros", "unordered"]))
    costs = {
        "tokens": lengths.astype(np.float64),
        "flops": lengths + lengths.astype(np.float64) ** 2 / 3.7,
        "tiny": lengths * 1e-300,  # quotients past the float range
        "zeros": np.where(lengths < 4, 0.0, lengths * 2.5),
        "unordered": rng.random(n) * 100,  # a cost not increasing with the length
    }[kind]
    cap = draw(st.sampled_from([None, int(lengths.max()), 4 * int(lengths.max())]))
    p = SimpleNamespace(
        lengths=lengths,
        sample_costs=costs,
        overhead=draw(st.sampled_from([0.0, 3.0, 1e3])),
        max_tokens=cap,
        microbatch_size=draw(st.sampled_from([None, 1, 3, 8])),
        oversize=np.zeros(n, dtype=bool),
    )
    samples = rng.permutation(n)[: draw(st.integers(1, n))]
    return p, samples, draw(st.integers(1, n + 2))


@settings(max_examples=examples(300, quick=60), deadline=None)
@given(step=_steps())
def test_the_cut_is_the_whole_bisections(step: tuple) -> None:
    # Issue 27 (speed9): the bisection ran all of its 40 steps, though on ~90% of them the cut
    # it ends with was already found (e.g. a step of 3,000 samples in 750 micro-batches).
    p, samples, k = step
    checked = _padded.segment(p, samples, k)
    with _settled_at(1 << 30):  # never checked: the whole bisection
        whole = _padded.segment(p, samples, k)
    with _settled_at(1):  # every cut checked
        assert _padded.segment(p, samples, k) == whole
    assert checked == whole


class _settled_at:
    """``_padded._SETTLED`` set to ``value`` within the block."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __enter__(self) -> None:
        self.kept, _padded._SETTLED = _padded._SETTLED, self.value

    def __exit__(self, *args: object) -> None:
        _padded._SETTLED = self.kept


def test_a_long_cut_is_bisected_in_few_walks(monkeypatch) -> None:
    walks = []
    walk = _padded._Cuts.walk

    def counted(self, budget, *args):
        walks.append(budget)
        return walk(self, budget, *args)

    monkeypatch.setattr(_padded._Cuts, "walk", counted)
    lengths = np.random.default_rng(0).integers(1, 4096, 3000)
    p = SimpleNamespace(
        lengths=lengths,
        sample_costs=lengths.astype(np.float64),
        overhead=0.0,
        max_tokens=None,
        microbatch_size=4,
        oversize=np.zeros(lengths.size, dtype=bool),
    )
    chunks = _padded.segment(p, np.arange(lengths.size), 750)
    assert [len(chunk) for chunk in chunks] == [4] * 750
    assert len(walks) <= 6  # the cut by 4s is the least at once (41 walks before)


@settings(max_examples=examples(400, quick=50), deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from([0.0, 1.0, 2.5, 1e300, 1e-300, float("inf")]),
            st.sampled_from([1.0, 0.5, 0.3, 0.001]),
            st.booleans(),
        ),
        min_size=1,
        max_size=16,
    ),
    cost=st.sampled_from([0.0, 1.0, 3.7, 1e308, 2.0**960]),
)
def test_a_rank_dealt_in_python_is_numpys(rows: list[tuple], cost: float) -> None:
    # deal with rank speeds on few ranks picks the rank by a Python loop (speed9): the rank
    # numpy's argmin picks, overflows and every rank full included.
    loads, speeds, full = (np.array(column) for column in zip(*rows, strict=True))
    with np.errstate(over="ignore"):
        expected = _padded._earliest_numpy(loads, full, cost, speeds)
    assert _padded._earliest(loads, full, cost, speeds) == expected
