"""The solver on hand-built graphs (tests/synthetic.py), whose optima are worked out by hand.

No model is captured: each graph is a few nodes with sizes in bytes and seconds per node, so every
number the solver sees is in the test.  The bytes of a backward stage are worked out as the
simulator counts them (`monet.simulate`): the constants (``w`` and ``x``, 4 bytes each; the output,
which the caller holds, and its gradient ``tangents_1``), the forward values kept for this or a
later stage, what the stage recomputes, and the stage's input and output gradients.
"""
import numpy as np
import pytest

from monet.solver import formulation, relaxation, repair
from monet.solver.ilp import InfeasibleBudgetError, problem_size
from monet.solver.finish import memory_model
from monet.solver.solve import PEERS, eager_peak, min_budget, solve
from monet.solver.deadline import Deadline
from synthetic import blocks, chain, costs_of, diamond, dropping, joint_graph, simulated_peak

MS = 1e-3


def _graph(nodes):
    fwd, bwd = nodes
    return joint_graph(fwd, bwd), costs_of(fwd, bwd)


def _extra_s(sol, costs) -> float:
    """Seconds the schedule recomputes (its objective less the keep-everything step)."""
    return sol.meta.objective_s - costs.total_time


def _recomputed(sol) -> list[list[int]]:
    """[stage, forward node] of every recomputation."""
    return np.argwhere(sol.R).tolist()


# The chain x -> a0 (4000 B) -> a1 (400 B) -> a2 (4000 B) -> a3 (400 B) -> a4 (40 B), gradients of
# each value's size.  Constants 88 B (x 4, w 4, the output 40, its gradient 40).  Keeping
# everything, the peak is in the stage of a3's gradient (backward node 1): it reads a2 and holds
# a0, a1, a2, the 400-byte gradient in and the 4000-byte gradient out: 12,800 + 88 = 12,888 B.
# Only dropping a0 lowers it (a2 is read there, a1 and a3 are small): 8,888 B, for one
# recomputation of a0 in the stage that reads it.  Below that every stage holds at most one
# 4000-byte value besides its two gradients: 8,400 + 88 = 8,488 B is the smallest budget, reached
# by dropping a0 and a1 (a1 recomputed from a0, recomputed first in its stage, then a0 again in
# the last stage): a0 twice and a1 once.
CHAIN = ([4000, 400, 4000, 400, 40], [1 * MS, 5 * MS, 0.5 * MS, 5 * MS, 1 * MS])


def test_the_chain_keeps_everything_at_the_plain_peak():
    graph, costs = _graph(chain(*CHAIN))
    assert eager_peak(graph, costs) == 12_888
    sol = solve(graph, costs, 12_888, time_limit=10)
    assert _recomputed(sol) == [] and _extra_s(sol, costs) == pytest.approx(0.0)


@pytest.mark.parametrize("budget", [12_887, 10_000, 8_888])
def test_the_chain_recomputes_the_value_that_lowers_the_peak_not_the_cheapest(budget):
    graph, costs = _graph(chain(*CHAIN))
    sol = solve(graph, costs, budget, time_limit=10)
    # a2 is cheaper to recompute (0.5 ms) but read in the peak's own stage: dropping it saves nothing
    assert simulated_peak(graph, costs, *dropping(graph, [2])) == 12_888
    assert _recomputed(sol) == [[3, 0]]
    assert _extra_s(sol, costs) == pytest.approx(1 * MS)
    assert sol.meta.predicted_peak_bytes == 8_888 <= budget


def test_the_chain_at_its_smallest_budget():
    graph, costs = _graph(chain(*CHAIN))
    assert min_budget(graph, costs, time_limit=10) == (8_488, True)
    sol = solve(graph, costs, 8_488, time_limit=10)
    assert sorted(_recomputed(sol)) == [[2, 0], [2, 1], [3, 0]]
    assert _extra_s(sol, costs) == pytest.approx(7 * MS)
    with pytest.raises(InfeasibleBudgetError, match="8488 bytes") as err:
        solve(graph, costs, 8_487, time_limit=10)
    assert err.value.min_budget_bytes == 8_488


# Keeping and recomputing nothing, the chain's largest stage (a3's gradient) still holds the 400-byte
# gradient in, the 4000-byte gradient out and the 88 bytes of constants: 4,488 B, the floor under
# every schedule's ILP memory.  Below it the greedy gives up before its first move.
def test_no_schedule_goes_under_the_floor_and_the_greedy_refuses_a_budget_below_it(monkeypatch):
    graph, costs = _graph(chain(*CHAIN))
    mem = memory_model(graph, costs)
    assert mem.floor() == 4_488
    allow_s = formulation.allowed(mem)[2]
    rng = np.random.default_rng(0)
    for _ in range(200):
        S = (rng.random(allow_s.shape) < 0.5) & allow_s
        R = rng.random((allow_s.shape[0], mem.n_fwd)) < 0.3
        assert mem.peak(S, R) >= mem.floor()
    assert repair.drop_greedily(graph, mem, allow_s, 8_488, costs.fwd_recompute) is not None
    calls = []
    monkeypatch.setattr(repair, "repair", lambda *a, **k: calls.append(a))
    assert repair.drop_greedily(graph, mem, allow_s, 4_487, costs.fwd_recompute) is None
    assert calls == []


# The diamond x, w -> a (4000 B, 1 ms) -> b (400 B), c (4000 B) -> d (40 B); the backward reads c,
# then b, then a twice; 40-byte gradients.  Constants 48 B in the forward pass (x, w, d's
# gradient), 88 B in the backward (d as well, and a stage's output gradient).  Keeping
# everything, the first stage holds a, b, c: 8,400 + 128 = 8,528 B.  Forward nodes are not
# recomputed in the forward pass, so computing c holds a, b and c: 8,400 + 48 = 8,448 B, the
# smallest budget.  Below 8,528 only dropping a helps (c is read in the first stage, b is
# needed by d and by the second): a is recomputed in the third stage and kept for the fourth,
# one recomputation (1 ms), not two.
def test_the_diamond_recomputes_a_shared_input_once_and_keeps_it():
    graph, costs = _graph(diamond())
    assert eager_peak(graph, costs) == 8_528
    assert min_budget(graph, costs, time_limit=10) == (8_448, True)
    for budget in (8_527, 8_448):
        sol = solve(graph, costs, budget, time_limit=10)
        assert _recomputed(sol) == [[2, 0]] and sol.S[3, 0]
        assert _extra_s(sol, costs) == pytest.approx(1 * MS)
    with pytest.raises(InfeasibleBudgetError):
        solve(graph, costs, 8_447, time_limit=10)


# Four blocks q_{j-1} -> p_j (4000 B, 1 ms) -> q_j (400 B, 5 ms), last block's backward first.
# Keeping everything, the first stage holds every value (17,600 B), the output q_4 and its
# gradient (800 B), x, w and a 40-byte gradient: 18,048 B.  Each p_j of the first three blocks,
# dropped and recomputed once in its own block's stage, frees 4000 B there and costs 1 ms; p_4 is
# read in the first stage, and a q saves a tenth of the bytes for five times the time.  So 4000 m
# bytes less than the plain peak cost m ms, for m up to 3.
@pytest.mark.parametrize("m", [0, 1, 2, 3])
def test_repeated_blocks_cost_one_cheap_recomputation_per_4000_bytes(m):
    graph, costs = _graph(blocks(4))
    assert eager_peak(graph, costs) == 18_048
    sol = solve(graph, costs, 18_048 - 4000 * m, time_limit=10)
    assert _extra_s(sol, costs) == pytest.approx(m * MS)
    recomputed = [i for _, i in _recomputed(sol)]
    assert len(recomputed) == len(set(recomputed)) == m  # each once
    assert all(i % 2 == 0 and i != 6 for i in recomputed)  # p_1, p_2 or p_3 (forward nodes 0, 2, 4)


@pytest.mark.parametrize("name", sorted(set(PEERS) - {"checkpoint_all"}))
def test_every_peer_fits_the_budget_and_none_beats_the_optimum(name):
    graph, costs = _graph(chain(*CHAIN))
    sol = PEERS[name](graph, costs, 8_888, deadline=Deadline(10))
    assert sol.meta.predicted_peak_bytes <= 8_888
    assert _extra_s(sol, costs) >= 1 * MS - 1e-12


def test_keeping_everything_names_the_plain_peak_as_its_smallest_budget():
    graph, costs = _graph(chain(*CHAIN))
    with pytest.raises(InfeasibleBudgetError) as err:
        PEERS["checkpoint_all"](graph, costs, 8_888, deadline=Deadline(10))
    assert err.value.min_budget_bytes == 12_888


@pytest.mark.parametrize("time_limit", [0.05, 1.0])
def test_a_small_graph_gets_its_optimum_whatever_the_time_limit(time_limit):
    graph, costs = _graph(chain(*CHAIN))
    sol = solve(graph, costs, 8_488, time_limit=time_limit)
    assert _extra_s(sol, costs) == pytest.approx(7 * MS)


def test_a_small_lp_relaxation_is_solved_whatever_the_time_limit():
    """An LP of at most `LARGE` variables is solved whole (docs/design.md, "Note [Small problems
    are solved whole]"): the same bound with no time as with a minute."""
    graph, costs = _graph(chain(*CHAIN))
    mem = memory_model(graph, costs)
    assert problem_size(graph, mem, np.zeros(len(graph.fwd)), "normal")[0] <= formulation.LARGE
    bound, frac = relaxation.min_budget_relaxation(graph, mem, "normal", time_limit=1e-9)
    assert bound is not None and frac is not None
    assert bound == pytest.approx(relaxation.min_budget_relaxation(graph, mem, "normal", time_limit=60)[0], rel=1e-9)


def test_the_run_information_is_one_typed_record():
    """The solvers take a `RunInfo` (a dict of its fields is converted once, at the entry); the
    solution records it, and a key that is no field is refused with the fields named."""
    from monet.solution import RunInfo

    graph, costs = _graph(chain(*CHAIN))
    sol = solve(graph, costs, None, "normal", time_limit=5, info={"model": "chain", "device": "cpu"})
    assert sol.meta.model == "chain" and sol.meta.batch_size == graph.input_shape[0]
    assert RunInfo.of(None) == RunInfo() and RunInfo.of(RunInfo(model="m")).model == "m"
    with pytest.raises(TypeError, match="'modle'.*a RunInfo has model, batch_size"):
        solve(graph, costs, None, "normal", time_limit=5, info={"modle": "chain"})
