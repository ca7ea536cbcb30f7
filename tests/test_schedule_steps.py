"""The schedule's typed steps (`monet.steps`): their order, the matrices they give back, the
executor's check that every step can run (`monet.executor.check_steps`), and the pruning of
recomputations nothing reads (`monet.matrices.without_dead_recomputations`)."""
from __future__ import annotations

import numpy as np
import pytest

from monet.executor import ScheduleError, check_steps
from monet.matrices import matrices_from_schedule, schedule_from_matrices, without_dead_recomputations
from monet.simulate import schedule_peak
from monet.solution import Schedule, Stage
from monet.solver import formulation
from monet.solver.repair import repair
from monet.solver.solve import memory_model
from monet.steps import BACKWARD, COMPUTE, FORWARD, FREE, KEEP, OFFLOAD, PREFETCH, RECOMPUTE, Step
from test_solver_fast_path import case  # noqa: F401  (the same small graphs: UserNet, a small ResNet-50)


def _graph_and_memory(case):
    graph, costs, _ = case
    return graph, memory_model(graph, costs)


def _schedules(graph, mem, n, seed=0):
    """(S (T, N), R (T, N)) of repaired random keep choices, keep-nothing and keep-everything first."""
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    rng = np.random.default_rng(seed)
    for k in range(n):
        if k < 2:
            keep = np.full((P.T, P.G), k == 1)
        else:
            keep = rng.random((P.T, P.G)) < rng.uniform(0.1, 0.9)
        S, R = repair(graph, mem, keep, P.allow_s)
        yield mem.group_to_node(S), R


def test_steps_of_a_schedule_in_execution_order():
    sched = Schedule(saved=(0, 2), stages=[Stage(0, (1,), (2,)), Stage(1, (), (0, 1))],
                     offload=(("v", 2, 1), ("w", 7, 0)))
    assert sched.steps(3) == [
        Step(COMPUTE, FORWARD, 0), Step(COMPUTE, FORWARD, 1), Step(COMPUTE, FORWARD, 2),
        Step(OFFLOAD, FORWARD, 2, "v"), Step(OFFLOAD, FORWARD, 7, "w"),
        Step(KEEP, FORWARD, 0), Step(KEEP, FORWARD, 2),
        Step(PREFETCH, 0, 0, "w"), Step(RECOMPUTE, 0, 1), Step(BACKWARD, 0, 0), Step(FREE, 0, 2),
        Step(KEEP, 0, 1),  # node 0 stays kept from the forward pass; node 1, recomputed, becomes kept
        Step(PREFETCH, 1, 1, "v"), Step(BACKWARD, 1, 1), Step(FREE, 1, 0), Step(FREE, 1, 1)]
    assert [s for s in sched.steps() if s.kind == COMPUTE] == []
    assert sched.recompute_count() == 1


def test_steps_give_back_the_matrices(case):
    """schedule_from_matrices -> steps -> matrices_from_schedule is the identity on valid (repaired)
    schedules: R exactly, S on the nodes whose outputs something reads after them (the others are
    never kept)."""
    graph, mem = _graph_and_memory(case)
    useful = np.array([n.saved_bytes > 0 for n in graph.fwd])
    for S, R in _schedules(graph, mem, 10):
        sched = schedule_from_matrices(graph, S, R)
        S2, R2 = matrices_from_schedule(graph, sched)
        assert np.array_equal(R2, R)
        assert np.array_equal(S2, S & useful[None, :])
        # every recompute step finds its inputs computed earlier in its stage or kept
        check_steps(graph, sched)


def test_check_steps_names_the_stage_node_and_missing_input(case):
    """A recomputation moved before the recomputation of its input (not kept) cannot run: the error
    names the stage, the recomputed node and the value it misses."""
    graph, mem = _graph_and_memory(case)
    S, R = next(_schedules(graph, mem, 1))  # keep nothing that can be recomputed: long chains
    sched = schedule_from_matrices(graph, S, R)
    kept = set(sched.saved)
    for t, stage in enumerate(sched.stages):
        order = list(stage.recompute)
        pair = next(((i, j) for i in order for j in graph.fwd[i].fwd_inputs
                     if j in order and j not in kept), None)
        kept = (kept | set(stage.recompute)) - set(stage.release)
        if pair is not None:
            break
    assert pair is not None, "keeping nothing should recompute a chain in some stage"
    i, j = pair
    order.remove(i)
    sched.stages[t] = Stage(stage.backward, [i] + order, stage.release)
    with pytest.raises(ScheduleError) as err:
        check_steps(graph, sched)
    msg = str(err.value)
    assert f"backward stage {t}: recomputing forward node {i} " in msg
    assert f"(forward node {j}, {graph.fwd[j].op})" in msg and "neither keeps nor recomputes" in msg


def test_check_steps_refuses_a_schedule_for_another_graph(case):
    graph = case[0]
    T, N = len(graph.bwd), len(graph.fwd)
    with pytest.raises(ScheduleError, match=f"{T - 1} backward stages, the graph {T} backward nodes"):
        check_steps(graph, Schedule(saved=(), stages=[Stage(t) for t in range(T - 1)]))
    stages = [Stage(t) for t in range(T)]
    stages[3] = Stage(3, recompute=(N + 5,))
    with pytest.raises(ScheduleError, match=f"backward stage 3: recompute step names node {N + 5}, but the "
                                            f"graph has {N} forward nodes"):
        check_steps(graph, Schedule(saved=(), stages=stages))


def test_dead_recomputations_are_dropped(case):
    """A recomputation that nothing reads goes, with the keeps it alone needed; the rest stays."""
    graph, _, _ = case
    T, N = len(graph.bwd), len(graph.fwd)
    S, R = np.ones((T, N), dtype=bool), np.zeros((T, N), dtype=bool)
    t = max(t for t in range(T) if graph.bwd[t].fwd_inputs)  # the last stage that reads the forward
    read = next(iter(graph.bwd[t].fwd_inputs))
    dead = next(i for i in range(N) if i != read and i not in graph.bwd[t].fwd_inputs
                and i not in graph.fwd[read].fwd_inputs)
    S[t:, read] = False
    R[t, read] = True  # needed: backward node t reads it
    R[t, dead] = True  # dead: nothing in stage t or after reads it
    S2, R2 = without_dead_recomputations(graph, S, R)
    assert R2[t, read] and not R2[t, dead] and R2.sum() == 1
    assert not S2[t:, dead].any() and not S2[t:, read].any()
    assert S2[t, list(graph.fwd[read].fwd_inputs)].all(), "the recomputation's inputs are no longer kept"


def test_pruned_schedules_run_in_no_more_memory_or_recomputation(case):
    """Keep everything, plus recomputations drawn at random (each one's inputs kept, so the schedule
    runs): pruned, it still runs, in no more memory and with fewer recomputations."""
    graph, costs, _ = case
    T, N = len(graph.bwd), len(graph.fwd)
    rng = np.random.default_rng(0)
    for p in (0.05, 0.2, 0.5):
        S, R = np.ones((T, N), dtype=bool), rng.random((T, N)) < p
        S2, R2 = without_dead_recomputations(graph, S, R)
        assert (R2 <= R).all() and (S2 <= S).all()
        before, after = schedule_from_matrices(graph, S, R), schedule_from_matrices(graph, S2, R2)
        check_steps(graph, after)
        assert schedule_peak(graph, costs, after).peak_bytes <= schedule_peak(graph, costs, before).peak_bytes
        assert after.recompute_count() < before.recompute_count()
