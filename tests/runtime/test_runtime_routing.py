"""Routing of a rebalanced step, without processes: slots to ranks, who sends what to whom."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan import ContextParallel, PlanOptions, plan_step
from seqbalance.plan._problem import objective_value
from seqbalance.runtime.rebalancing.pieces import route_pieces
from seqbalance.runtime.rebalancing.routing import keep_local_labels, route, transfers


@st.composite
def steps(draw: st.DrawFn) -> tuple[object, np.ndarray, np.ndarray]:
    """A planned step: the plan, each sample's origin rank and its size in bytes."""
    world = draw(st.integers(1, 6))
    counts = draw(st.lists(st.integers(0, 7), min_size=world, max_size=world))
    n = sum(counts)
    lengths = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    objective = draw(st.sampled_from(["step", "lockstep"]))
    plan = plan_step(lengths, world, allow_empty=True, objective=objective, max_tokens=600)
    origin = np.repeat(np.arange(world), counts)
    # Bytes: a few bytes per token, sometimes a sample with no payload at all.
    nbytes = np.array(lengths, dtype=np.int64) * draw(st.sampled_from([0, 1, 2, 8]))
    return plan, origin, nbytes


def _simulate_all_to_all(t, payload: dict[int, np.ndarray]) -> dict[int, dict[int, np.ndarray]]:
    """Carry out ``t`` as all_to_all_single would; every rank parses its buffer by
    ``t.receives``. ``payload[g]`` is the bytes of what ``g`` names (a sample, or with
    ``t.ids`` what an entry carries); returns what each rank parsed."""
    k = t.world_size
    send_buffers = []
    for rank in range(k):
        sends = t.sends(rank)
        if t.ids is None:  # entries are the samples themselves
            assert (t.target[sends] != rank).all() and (t.source[sends] == rank).all()
        buffer = np.concatenate([payload[g] for g in sends.tolist()] or [np.zeros(0, np.int64)])
        assert buffer.size == sum(t.send_splits(rank))
        send_buffers.append(np.split(buffer, np.cumsum(t.send_splits(rank))[:-1]))
    parsed: dict[int, dict[int, np.ndarray]] = {}
    for rank in range(k):
        arrived = np.concatenate([send_buffers[src][rank] for src in range(k)])
        assert arrived.size == sum(t.recv_splits(rank))
        receives = t.receives(rank)
        sizes = [payload[g].size for g in receives.tolist()]
        chunks = np.split(arrived, np.cumsum(sizes)[:-1]) if receives.size else []
        parsed[rank] = dict(zip(receives.tolist(), chunks, strict=True))
    return parsed


@given(step=steps(), keep_local=st.booleans())
def test_every_sample_ends_on_exactly_one_rank_in_plan_order(step, keep_local) -> None:
    plan, origin, nbytes = step
    routing = route(plan.ranks, origin, nbytes, keep_local=keep_local)
    k = plan.dp_size
    assert sorted(routing.rank_of_slot.tolist()) == list(range(k))
    held = [routing.held(rank) for rank in range(k)]
    assert sorted(np.concatenate(held).tolist()) == list(range(origin.size))
    for rank in range(k):
        slot = int(routing.slot_of_rank[rank])
        assert routing.rank_of_slot[slot] == rank
        expected = [int(i) for mb in plan.ranks[slot] for i in mb]
        assert held[rank].tolist() == expected
        assert (routing.destination[held[rank]] == rank).all()
        assert routing.position[held[rank]].tolist() == list(range(len(expected)))


@given(step=steps(), keep_local=st.booleans())
def test_split_sizes_match_and_every_byte_arrives_where_it_belongs(step, keep_local) -> None:
    plan, origin, nbytes = step
    routing = route(plan.ranks, origin, nbytes, keep_local=keep_local)
    forward = routing.forward
    k = plan.dp_size
    moving = origin != routing.destination
    assert forward.moved_bytes == int(nbytes[moving].sum())
    for src in range(k):
        for dst in range(k):
            assert forward.send_splits(src)[dst] == forward.recv_splits(dst)[src]
            pair = (origin == src) & (routing.destination == dst) & moving
            assert forward.send_splits(src)[dst] == int(nbytes[pair].sum())
    payload = {g: np.full(int(nbytes[g]), g, dtype=np.int64) for g in range(origin.size)}
    parsed = _simulate_all_to_all(forward, payload)
    for rank in range(k):
        arriving = np.flatnonzero((routing.destination == rank) & moving)
        assert sorted(parsed[rank]) == arriving.tolist()
        for g, chunk in parsed[rank].items():
            assert np.array_equal(chunk, payload[g])
    # Outputs of another size per sample go back to their origin the same way.
    out_bytes = (np.arange(origin.size) % 3) * 4
    back = routing.backward(out_bytes)
    returned = _simulate_all_to_all(back, {g: np.full(int(out_bytes[g]), -g) for g in payload})
    for rank in range(k):
        assert sorted(returned[rank]) == np.flatnonzero((origin == rank) & moving).tolist()


@given(step=steps())
def test_relabelling_keeps_the_plans_quality_and_never_moves_more_bytes(step) -> None:
    plan, origin, nbytes = step
    relabelled = route(plan.ranks, origin, nbytes, keep_local=True)
    identity = route(plan.ranks, origin, nbytes, keep_local=False)
    assert identity.rank_of_slot.tolist() == list(range(plan.dp_size))
    assert relabelled.forward.moved_bytes <= identity.forward.moved_bytes
    costs = plan.costs[relabelled.slot_of_rank]  # rank r runs its slot's micro-batches
    objective = plan.options.objective
    assert objective_value(costs, objective) == objective_value(plan.costs, objective)
    assert sorted(costs.sum(axis=1).tolist()) == sorted(plan.costs.sum(axis=1).tolist())


def test_keep_local_moves_a_rank_whose_samples_all_went_to_another_slot() -> None:
    # Rank 1 holds both samples; the plan puts them in slot 0: rank 1 runs slot 0.
    routing = route([[np.array([0, 1])], [np.array([], dtype=np.int64)]], [1, 1], [5, 7])
    assert routing.rank_of_slot.tolist() == [1, 0]
    assert routing.destination.tolist() == [1, 1]
    assert routing.forward.moved_bytes == 0


def test_keep_local_falls_back_to_identity_where_greedy_would_keep_less() -> None:
    # Bytes in common (slot, rank): (0,0)=10, (0,1)=11, (1,1)=10. Greedy takes (0,1) first and
    # keeps 11; the identity keeps 20.
    slot_of_sample = np.array([0, 0, 1])
    origin = np.array([0, 1, 1])
    nbytes = np.array([10, 11, 10])
    assert keep_local_labels(slot_of_sample, origin, nbytes, 2).tolist() == [0, 1]
    routing = route([[np.array([0, 1])], [np.array([2])]], origin, nbytes)
    assert routing.forward.moved_bytes == 11
    assert routing.forward.sends(1).tolist() == [1]
    assert routing.forward.send_splits(1) == [11, 0]
    assert routing.forward.receives(0).tolist() == [1]


def test_send_and_arrival_orders_are_by_peer_then_index() -> None:
    t = transfers([0, 0, 0, 1, 2, 2], [2, 1, 2, 0, 0, 1], [1, 2, 3, 4, 5, 6], 3)
    assert t.sends(0).tolist() == [1, 0, 2]  # to rank 1, then to rank 2 (ascending index)
    assert t.receives(0).tolist() == [3, 4]  # from rank 1, then from rank 2
    assert t.send_splits(0) == [0, 2, 4]
    assert t.recv_splits(0) == [0, 4, 5]
    assert t.matrix.tolist() == [[0, 2, 4], [4, 0, 0], [5, 6, 0]]


def test_route_rejects_a_plan_that_loses_or_repeats_a_sample() -> None:
    with pytest.raises(ValueError, match="sample 2 is in no plan slot"):
        route([[np.array([0])], [np.array([1])]], [0, 0, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="plan slot 1 repeats"):
        route([[np.array([0, 1])], [np.array([1])]], [0, 1], [1, 1])
    with pytest.raises(ValueError, match="outside world_size"):
        transfers([0, 3], [0, 0], [1, 1], 2)


def _slots_one_slot_at_a_time(plan_ranks, n):
    """The per-slot definition of a sample's slot and position (what ``route`` computes in
    whole-array operations), with its errors."""
    slot_of_sample = np.full(n, -1, dtype=np.int64)
    position = np.zeros(n, dtype=np.int64)
    for slot, microbatches in enumerate(plan_ranks):
        flat = np.concatenate([np.asarray(mb, dtype=np.int64) for mb in microbatches] or [[]])
        flat = flat.astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise ValueError(f"plan slot {slot} holds a sample index outside [0, {n})")
        if (slot_of_sample[flat] >= 0).any() or np.unique(flat).size != flat.size:
            raise ValueError(f"plan slot {slot} repeats a sample index")
        slot_of_sample[flat] = slot
        position[flat] = np.arange(flat.size)
    if (slot_of_sample < 0).any():
        raise ValueError(f"sample {int(np.flatnonzero(slot_of_sample < 0)[0])} is in no plan slot")
    return slot_of_sample, position


@given(
    n=st.integers(0, 12),
    data=st.data(),
)
def test_route_finds_every_slot_and_position_and_error_as_the_per_slot_definition(n, data):
    # Micro-batches of indices in [-1, n]: valid plans, lost, repeated and outside indices.
    plan_ranks = data.draw(
        st.lists(
            st.lists(st.lists(st.integers(-1, n), max_size=5).map(np.array), max_size=3),
            min_size=1,
            max_size=4,
        )
    )
    if data.draw(st.booleans()):  # a valid plan: a permutation cut into micro-batches
        order = data.draw(st.permutations(range(n)))
        cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=5, max_size=5)))
        pieces = np.split(np.array(order, dtype=np.int64), cuts)
        plan_ranks = [pieces[:2], pieces[2:4], pieces[4:]]
    origin = np.zeros(n, dtype=np.int64)
    try:
        expected = _slots_one_slot_at_a_time(plan_ranks, n)
    except ValueError as error:
        with pytest.raises(ValueError, match=f"^{re.escape(str(error))}$"):
            route(plan_ranks, origin, origin, keep_local=False)
        return
    routing = route(plan_ranks, origin, origin, keep_local=False)
    assert routing.slot_of_sample.tolist() == expected[0].tolist()
    assert routing.position.tolist() == expected[1].tolist()


# ------------------------------------------------------------------ context parallelism
CP_COST = ContextParallelTimeModel(TimeModel(1e-3, 1e-6, 1e-9), CommModel(1e9, 1e-5), 16, 2)


@st.composite
def cp_steps(draw: st.DrawFn) -> tuple[object, np.ndarray, np.ndarray]:
    """A context-parallel step: its plan, each sample's origin rank and its bytes."""
    world = draw(st.sampled_from([1, 2, 3, 4, 6]))
    counts = draw(st.lists(st.integers(0, 5), min_size=world, max_size=world))
    n = sum(counts)
    cap = draw(st.integers(4, 64))
    sizes = draw(st.sampled_from([(1, 2, 4), (1, 2, 3, 6), (2, 3), (1,)]))
    if not any(world % s == 0 for s in sizes):
        sizes = (1,)
    widest = max(s for s in sizes if world % s == 0)
    lengths = draw(st.lists(st.integers(0, widest * cap), min_size=n, max_size=n))
    options = PlanOptions(
        cost=CP_COST,
        max_tokens=cap,
        context_parallel=ContextParallel(sizes=sizes),
        allow_empty=True,
    )
    plan = plan_step(lengths, world, options)
    origin = np.repeat(np.arange(world), counts)
    nbytes = np.array(lengths, dtype=np.int64) * draw(st.sampled_from([0, 1, 4]))
    return plan, origin, nbytes


@given(step=cp_steps())
def test_every_member_of_a_cp_group_gets_the_sample_and_outputs_go_home(step) -> None:
    plan, origin, nbytes = step
    routing = route_pieces(plan, origin, nbytes)
    k = plan.n_ranks
    for rank in range(k):
        held = routing.held(rank)
        rows = np.concatenate(plan.ranks[rank]) if plan.n_slots else np.zeros((0, 2), np.int64)
        assert routing.sample[held].tolist() == rows[:, 0].tolist()
        assert routing.shard[held].tolist() == rows[:, 1].tolist()
        assert routing.position[held].tolist() == list(range(held.size))
    payload = {g: np.full(int(nbytes[g]), g, dtype=np.int64) for g in range(origin.size)}
    parsed = _simulate_all_to_all(routing.forward, payload)
    for rank in range(k):
        needs = {int(g) for g in routing.sample[routing.held(rank)] if origin[g] != rank}
        assert sorted(parsed[rank]) == sorted(needs)  # each sample once, from its origin
        for g, chunk in parsed[rank].items():
            assert np.array_equal(chunk, payload[g])
    # Each member's outputs of its share go back to the sample's origin, by piece.
    pieces = routing.sample.size
    out_bytes = (np.arange(pieces) % 3) * 4
    back = routing.backward(out_bytes)
    returned = _simulate_all_to_all(
        back, {p: np.full(int(out_bytes[p]), -p) for p in range(pieces)}
    )
    for rank in range(k):
        away = (origin[routing.sample] == rank) & (routing.destination != rank)
        assert sorted(returned[rank]) == np.flatnonzero(away).tolist()
        for g in np.flatnonzero(origin == rank).tolist():
            shards = routing.shard[routing.pieces_of(g)].tolist()
            assert shards == list(range(int(plan.cp_size[g])))


def test_route_pieces_checks_its_arrays() -> None:
    plan = plan_step(
        [10, 3],
        2,
        PlanOptions(cost=CP_COST, max_tokens=8, context_parallel=ContextParallel(sizes=(1, 2))),
    )
    with pytest.raises(ValueError, match="one entry per sample"):
        route_pieces(plan, np.array([0]), np.array([1, 1]))
