"""Deep networks: chains of identical blocks, block-level schedules, and a solver that is
never worse than per-block checkpointing.

The model is a stack of 12 identical residual blocks, as a transformer is: the chain finder must
see 12 blocks whose boundaries are the residual stream, every block policy must be a valid
schedule, and at the peak of per-block checkpointing (``torch.utils.checkpoint`` around each
block: keep each block's input, recompute the block once in its backward) the solver's schedule
must cost no more recomputation (analytic costs: the same on every machine).
"""
from __future__ import annotations

import functools
import time

import numpy as np
import pytest
from ci import skip_unless_long
import torch
import torch.nn as nn

from monet.capture import capture
from monet.graph import node_signatures
from monet.profiling.costs import analytic_costs, costs_for
from monet.simulate import schedule_peak
from monet.matrices import schedule_from_matrices
from monet.solver.blocks import crossing_bytes, find_chains
from monet.solver.formulation import allowed
from monet.solver.search import search
from monet.solver.repair import checkpointed
from monet.solver.finish import eager_peak, memory_model
from monet.solver.solve import solve
from monet.solver.structured import Structure, lower_hull

HIDDEN, BATCH, BLOCKS = 32, 256, 12  # activations, not parameters, make the peak


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Stack(nn.Module):
    """An embedding, ``BLOCKS`` identical residual blocks and a head: a transformer's shape."""

    def __init__(self, blocks: int = BLOCKS):
        super().__init__()
        self.embed = nn.Linear(8, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(HIDDEN, 4)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


@pytest.fixture(scope="module")
def stack():
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(BATCH, 8)
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    return model, x, graph, costs


def residual_adds(graph) -> list[int]:
    """The forward nodes that add a block's branch to its input: the residual stream, found
    without `monet.solver.blocks` (an add of two (BATCH, HIDDEN) tensors)."""
    return [n.id for n in graph.fwd if n.op == "aten.add.Tensor" and len(n.fwd_inputs) == 2
            and graph.values[n.outputs[0]].nbytes == BATCH * HIDDEN * 4]


def test_the_chain_is_the_twelve_blocks_cut_at_the_residual_stream(stack):
    _, _, graph, _ = stack
    sigs = node_signatures(graph)
    assert len(set(sigs.values())) < len(sigs) / 3  # twelve twins of each block's ops
    chains = find_chains(graph)
    assert len(chains) == 1
    chain = chains[0]
    assert chain.count == BLOCKS
    adds = residual_adds(graph)
    assert len(adds) == BLOCKS
    # each block ends with its residual add: what crosses a boundary is the residual stream only
    assert [chain.block(k)[-1] for k in range(BLOCKS)] == adds
    crossing = crossing_bytes(graph)
    assert all(crossing[chain.block(k)[0]] == BATCH * HIDDEN * 4 for k in range(1, BLOCKS))
    with pytest.raises(IndexError):
        chain.block(BLOCKS)


class PostNormBlock(nn.Module):
    """BERT's layer shape: the normalisation after the residual add, so that a cut just before it
    (the add only) crosses fewer bytes than one just after it (its output, mean and rstd)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x):
        return self.norm(x + self.down(torch.tanh(self.up(x))))


def test_a_post_norm_stack_is_cut_at_its_layers_not_inside_them():
    """Cut before each norm, the chain would hold one block fewer and leave the first layer's
    activations outside, where no block policy recomputes them (a 24-layer BERT: 12 MiB more than
    transformers' checkpointing of each layer)."""
    torch.manual_seed(0)
    model = Stack()
    model.blocks = nn.ModuleList(PostNormBlock() for _ in range(BLOCKS))
    graph = capture(model, torch.randn(BATCH, 8))
    crossing = crossing_bytes(graph)
    (chain,) = find_chains(graph)
    assert chain.count == BLOCKS
    norms = [n.id for n in graph.fwd if n.op == "aten.native_layer_norm.default"]
    assert [chain.block(k)[-1] for k in range(BLOCKS)] == norms
    inside = [chain.block(k)[-1] for k in range(BLOCKS - 1)]
    assert all(crossing[i] < crossing[i + 1] for i in inside)  # the cheaper cut in bytes is not taken


def test_no_chain_without_repetition():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    graph = capture(model, torch.randn(4, 8))
    assert find_chains(graph) == []
    costs = costs_for(graph, analytic_costs(graph))
    mem = memory_model(graph, costs)
    assert Structure(graph, mem, costs.fwd_recompute, allowed(mem)[2]).candidates(None) == []


def test_every_block_policy_is_a_schedule_the_ilp_memory_bounds(stack):
    _, _, graph, costs = stack
    mem = memory_model(graph, costs)
    st = Structure(graph, mem, costs.fwd_recompute, allowed(mem)[2])
    cands = st.candidates(0.5 * eager_peak(graph, costs))
    names = {c.name for c in cands}
    assert {"blocks:recompute", "blocks:recompute-every", "blocks:full", "blocks:compute"} <= names
    for c in cands:
        sim = schedule_peak(graph, costs, schedule_from_matrices(graph, mem.group_to_node(c.S), c.R)).peak_bytes
        assert sim <= c.peak + 1  # the ILP's memory bounds the simulator's
    by = {c.name: c for c in cands}
    assert by["blocks:full"].cost == 0.0  # keeping everything recomputes nothing
    assert by["blocks:recompute"].peak < by["blocks:full"].peak
    assert by["blocks:recompute"].cost > 0


def test_the_grown_policy_fits_and_recomputes_less_than_per_block_checkpointing(stack, monkeypatch):
    """`Structure.grown` keeps values of every block but the last as far as the budget allows: at a
    budget halfway between per-block checkpointing's peak and keeping everything, a schedule the
    ILP's memory fits (and so the simulator), recomputing less than per-block checkpointing; at
    the keep-everything peak, nothing recomputed; below the smallest peak it reaches, one schedule,
    over the budget (for the simulator to judge).
    Each step fits, so a deadline that has passed leaves the start (per-block checkpointing with
    the last block kept) on a graph the search bounds, and changes nothing on a small one."""
    import monet.solver.repair as repair

    _, _, graph, costs = stack
    mem = memory_model(graph, costs)
    st = Structure(graph, mem, costs.fwd_recompute, allowed(mem)[2])
    start = next(c for c in st.uniform() if c.name == "blocks:recompute")
    budget = (start.peak + eager_peak(graph, costs)) / 2
    grown = st.grown(budget)
    g = grown[0]
    assert g.name == "blocks:grown" and g.peak <= budget and g.cost < start.cost
    sim = schedule_peak(graph, costs, schedule_from_matrices(graph, mem.group_to_node(g.S), g.R)).peak_bytes
    assert sim <= g.peak + 1
    assert all(c.name.startswith("blocks:grown+") for c in grown[1:])
    assert st.grown(eager_peak(graph, costs))[0].cost == 0.0
    tight = st.grown(start.peak / 2)
    assert len(tight) == 1 and tight[0].peak > start.peak / 2
    passed = time.perf_counter()
    assert [c.cost for c in st.grown(budget, passed)] == [c.cost for c in grown]
    monkeypatch.setattr(repair, "ALWAYS_BUILT_CELLS", 0)
    assert [c.cost for c in st.grown(budget, passed)] == [start.cost]


def test_lower_hull_keeps_only_the_undominated_convex_points():
    pts = [(1, 10, "a"), (2, 9.9, "b"), (3, 4, "c"), (4, 5, "d"), (5, 0, "e")]
    assert [p[2] for p in lower_hull(pts)] == ["a", "c", "e"]  # b lies above a-c, d is dominated


def _post_norm_stack():
    """`Stack` of `PostNormBlock`: (graph, analytic costs, the embedding's node, block ends: the
    norms)."""
    torch.manual_seed(0)
    model = Stack()
    model.blocks = nn.ModuleList(PostNormBlock() for _ in range(BLOCKS))
    graph = capture(model, torch.randn(BATCH, 8))
    return graph, costs_for(graph, analytic_costs(graph)), _embedding(graph), \
        [n.id for n in graph.fwd if n.op == "aten.native_layer_norm.default"]


def _llama():
    """A 4-layer transformers Llama (grouped-query attention, rotary embeddings, RMSNorm
    decomposed into ATen ops): (graph, analytic costs, the embedding's node, block ends: every
    second residual add)."""
    from reach_models import missing

    if missing("transformers") is not None:
        pytest.skip(str(missing("transformers")))
    import monet
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         bos_token_id=0, eos_token_id=0, pad_token_id=0)).train()
    ids = torch.randint(0, 64, (8, 32), generator=torch.Generator().manual_seed(1))
    plan = monet.prepare(model, dict(input_ids=ids, labels=ids, use_cache=False), cost="analytic", progress=False)
    graph = plan.graph
    embedding = next(n.id for n in graph.fwd if n.op == "aten.embedding.default")
    stream = [embedding]  # the residual stream: the adds that read the embedding or an add of it
    for n in graph.fwd:
        if n.op == "aten.add.Tensor" and stream[-1] in n.fwd_inputs:
            stream.append(n.id)
    assert len(stream) == 9  # attention's and the MLP's residual add in each of the 4 layers
    return graph, plan.costs, embedding, stream[2::2]


def _embedding(graph) -> int:
    """A `Stack`'s embedding: its first node with a (BATCH, HIDDEN) output."""
    return next(n.id for n in graph.fwd if n.outputs and graph.values[n.outputs[0]].nbytes == BATCH * HIDDEN * 4)


def _pre_norm_stack(stack):
    _, _, graph, costs = stack
    return graph, costs, _embedding(graph), residual_adds(graph)


def per_block_checkpointing(graph, costs, feed: int, ends: list[int]):
    """Per-block checkpointing built from the block ends alone (not `monet.solver.blocks`): keep
    each block's input and everything outside the blocks; recompute the rest of each block once,
    at its first use in the backward pass, and keep it until the block's backward is done
    (``torch.utils.checkpoint``, `checkpointed`).  The blocks run from the first reader of
    ``feed``, the node whose output is block 0's input, to the last block end.  Returns (S (T, G), R (T, N),
    inside (N,) bool, kept (N,) bool)."""
    mem = memory_model(graph, costs)
    allow_s = allowed(mem)[2]
    first = min(n.id for n in graph.fwd if feed in n.fwd_inputs)
    inside = np.zeros(len(graph.fwd), dtype=bool)
    inside[first:ends[-1] + 1] = True
    kept = ~inside
    kept[ends] = True
    S, R = checkpointed(graph, mem, kept[mem.group_node], allow_s)
    return S, R, inside, kept


MODELS = {"pre-norm stack": _pre_norm_stack, "post-norm stack": lambda stack: _post_norm_stack(),
          "llama": lambda stack: _llama()}


@pytest.mark.parametrize("slack", [1.0, 1.25])
@pytest.mark.parametrize("name", list(MODELS))
def test_solver_never_slower_than_per_block_checkpointing(stack, name, slack):
    """At per-block checkpointing's simulated peak (and 25 % above it), the solver's schedule,
    simulated here from its own matrices rather than its reported figures, fits and recomputes
    no more seconds (analytic costs: the same on every machine).  The baseline recomputes every
    block exactly once: each node inside the blocks that the backward pass reads and that is
    not a block end once, nothing else."""
    if slack != 1.0:
        skip_unless_long("25 % above per-block checkpointing's peak", 20, "the short suite runs each model at that peak")
    graph, costs, feed, ends = MODELS[name](stack)
    S, R, inside, kept = per_block_checkpointing(graph, costs, feed, ends)
    mem = memory_model(graph, costs)
    times = R.sum(axis=0)
    assert times.max() == 1 and not times[kept].any()
    read = np.array([bool(n.bwd_read) for n in graph.fwd])
    assert (times[inside & ~kept & read] == 1).all()
    per_block_cost = float(costs.fwd_recompute @ times)
    per_block_peak = schedule_peak(graph, costs, schedule_from_matrices(graph, mem.group_to_node(S), R)).peak_bytes
    assert per_block_cost > 0 and per_block_peak < 0.7 * eager_peak(graph, costs)
    budget = int(slack * per_block_peak)
    sol = solve(graph, costs, budget, "normal", time_limit=4)  # the block-level schedules are starts: any limit
    assert schedule_peak(graph, costs, sol.schedule).peak_bytes <= budget
    assert float(costs.fwd_recompute @ np.asarray(sol.R).sum(axis=0)) <= per_block_cost + 1e-12
    if slack == 1.0:
        # and without any time to search (as at 96 layers, where no MIP solver runs and the local
        # search has little time per node): the block-level candidates alone meet it
        found = search(graph, mem, allowed(mem)[2], costs.fwd_recompute, mem.peak(S, R), None,
                       time.perf_counter())
        assert found is not None and found[2] <= per_block_cost + 1e-12


def test_budget_min_stops_where_memory_gets_expensive():
    """`knee`: from the largest peak down, the frontier is followed while one percent of the plain
    peak less costs at most KNEE_PRICE points of overhead (a 12-layer GPT-2's frontier, analytic
    costs: its smallest schedule, 10 % below per-block checkpointing, at +2,383 %)."""
    from monet.solver.smallest import KNEE_PRICE, knee

    mib, plain_s, plain_bytes = 2**20, 1.0, 300 * 2**20
    front = [(88.1 * mib, 23.831), (89.8 * mib, 16.846), (98.5 * mib, 0.315), (150.1 * mib, 0.084),
             (206.4 * mib, 0.034), (273.6 * mib, 0.0)]
    budget, note = knee(front, plain_s, plain_bytes)
    assert budget == int(np.ceil(98.5 * mib)) and "each MiB below it costs" in note
    # cheap all the way down: the smallest budget itself, and nothing to say
    flat = [(p, 0.001 * (300 - p / mib)) for p, _ in front]
    assert knee(flat, plain_s, plain_bytes) == (int(np.ceil(88.1 * mib)), "")
    assert KNEE_PRICE > 0


@functools.cache
def _llama_per_block():
    """A 4-layer transformers Llama (hidden 64, 2 x 64 tokens; analytic costs): its graph, costs,
    memory model, simulator (``peak_of``), ``allow_s`` and per-block checkpointing's candidate."""
    import depth  # benchmarks/ (on the path: tests/conftest.py)
    from monet.frontend import training_inputs
    from monet.inputs import ExampleInputs
    from monet.solver.finish import simulated_peak_fn

    model, inputs = depth.build("llama", 4, 64, 64, 2, 128)
    graph = capture(model, training_inputs(model, ExampleInputs.of(inputs)))
    costs = costs_for(graph, analytic_costs(graph))
    mem = memory_model(graph, costs)
    allow_s = allowed(mem)[2]
    per_block = next(c for c in Structure(graph, mem, costs.fwd_recompute, allow_s).uniform()
                     if c.name == "blocks:recompute")
    return graph, costs, mem, simulated_peak_fn(graph, costs, mem), allow_s, per_block


def test_a_block_schedule_the_simulator_fits_is_taken_over_the_ilps_count():
    """The ILP's memory over-counts per-block checkpointing on a transformers Llama (values the
    executor frees sooner): at a budget between its ILP peak and its simulated one, the search
    given the simulator returns a schedule at least as cheap as per-block checkpointing whose
    simulated peak fits, and never dearer than the search without it."""
    graph, costs, mem, peak_of, allow_s, per_block = _llama_per_block()
    simulated = peak_of(per_block.S, per_block.R)
    assert simulated < per_block.peak  # the ILP's count is above the simulator's
    budget = (simulated + per_block.peak) / 2
    S, R, cost, _ = search(graph, mem, allow_s, costs.fwd_recompute, budget, peak_of=peak_of)
    assert cost <= per_block.cost + 1e-12 and peak_of(S, R) <= budget
    found = search(graph, mem, allow_s, costs.fwd_recompute, budget)  # the ILP's count alone
    assert found is None or cost <= found[2] + 1e-12


def test_a_block_schedule_only_the_simulator_fits_is_returned_when_nothing_else_fits(monkeypatch):
    """At a budget between per-block checkpointing's simulated peak and its ILP count, where no other
    candidate fits the ILP's memory (the repaired candidates, the greedy, the window knapsack and
    the ladder find none), the search given the simulator returns a schedule the simulator fits, at
    most as dear as per-block checkpointing, instead of nothing (a 96-layer Llama at transformers'
    per-block peak then fell back to the smallest-budget schedule, +3,861 %).  The grown block
    policy finds one the ILP's count fits there (a kept value lowers the peak of a block recomputed
    whole), so it is left out for the second part."""
    import monet.solver.search as search_module
    from monet.solver.structured import Structure as St

    graph, costs, mem, peak_of, allow_s, per_block = _llama_per_block()
    budget = (peak_of(per_block.S, per_block.R) + per_block.peak) / 2
    monkeypatch.setattr(search_module, "repaired_candidates", lambda *a, **k: [])
    monkeypatch.setattr(search_module, "drop_greedily", lambda *a, **k: None)
    monkeypatch.setattr(search_module, "drop_windows", lambda *a, **k: None)
    monkeypatch.setattr(search_module, "ladder", lambda *a, **k: [])
    S, R, cost, peak = search(graph, mem, allow_s, costs.fwd_recompute, budget)
    assert peak <= budget and mem.peak(S, R) == peak and cost <= per_block.cost + 1e-12
    monkeypatch.setattr(St, "grown", lambda *a, **k: [])
    assert search(graph, mem, allow_s, costs.fwd_recompute, budget) is None  # the ILP's count alone
    for deadline in (None, time.perf_counter() + 5):
        S, R, cost, _ = search(graph, mem, allow_s, costs.fwd_recompute, budget, deadline=deadline, iterate=True,
                               peak_of=peak_of)
        assert peak_of(S, R) <= budget and cost <= per_block.cost + 1e-12


def test_the_search_takes_what_the_ilps_over_count_hides(stack):
    """Where the simulator's peak sits below the ILP's memory (here by a third of what per-block
    checkpointing saves), the search given it returns a schedule that recomputes less than the
    best the ILP's count allows at per-block checkpointing's peak, and that the simulator fits;
    with a simulator that agrees with the ILP, it returns what it was given."""
    from monet.solver.search import improve_in_simulated_slack
    from monet.solver.repair import improve

    _, _, graph, costs = stack
    mem = memory_model(graph, costs)
    allow_s = allowed(mem)[2]
    st = Structure(graph, mem, costs.fwd_recompute, allow_s)
    per_block = next(c for c in st.uniform() if c.name == "blocks:recompute")
    budget = per_block.peak
    S, R, cost = improve(graph, mem, per_block.S, per_block.R, budget, costs.fwd_recompute, allow_s,
                         time.perf_counter() + 10)
    assert cost > 0
    slack = (eager_peak(graph, costs) - budget) / 3

    def lower(S_, R_):
        return mem.peak(S_, R_) - slack

    S2, R2, c2 = improve_in_simulated_slack(graph, mem, S, R, cost, budget, costs.fwd_recompute, allow_s,
                                             time.perf_counter() + 3, lower)
    assert c2 < cost and lower(S2, R2) <= budget
    same = improve_in_simulated_slack(graph, mem, S, R, cost, budget, costs.fwd_recompute, allow_s,
                                       time.perf_counter() + 3, mem.peak)
    assert same[2] == cost and (same[0] == S).all()


def test_the_smallest_candidate_prefers_fewer_recomputations_and_never_simulates_a_huge_one(monkeypatch):
    """Among candidates of one ILP peak the one with fewer recomputations is simulated first, and one
    with more than SIMULATED_RECOMPUTATIONS_PER_NODE per forward node keeps its ILP peak: simulating
    a 96-layer Llama's candidate of 2.96 million recomputations grew its process to 24 GB."""
    import types

    import monet.solver.repair as repair

    N = 10
    graph = types.SimpleNamespace(fwd=list(range(N)))
    huge = np.ones((N, N * (repair.SIMULATED_RECOMPUTATIONS_PER_NODE + 1)), dtype=bool)
    lean = np.zeros((N, N), dtype=bool)
    lean[0, :3] = True
    cands = [(np.zeros((N, 1)), huge, 100.0, 0.0), (np.ones((N, 1)), lean, 100.0, 0.0), (np.ones((N, 1)), lean, 120.0, 0.0)]
    monkeypatch.setattr(repair, "repaired_candidates", lambda *a, **k: list(cands))
    simulated = []

    def peak_of(S, R):
        simulated.append(int(R.sum()))
        return 90.0

    peak, S, R = repair.smallest_candidate(graph, None, None, None, peak_of, simulate_best=2)
    assert simulated == [3] and peak == 90.0 and R is lean  # the huge one (ILP peak 100) not simulated
    cands[1] = (np.ones((N, 1)), lean, 101.0, 0.0)  # the huge one first: its ILP peak stands
    simulated.clear()
    peak, S, R = repair.smallest_candidate(graph, None, None, None, peak_of, simulate_best=2)
    assert simulated == [3] and peak == 90.0 and R is lean
    peak, S, R = repair.smallest_candidate(graph, None, None, None, peak_of, simulate_best=1)
    assert peak == 100.0 and R is huge
