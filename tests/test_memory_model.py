"""The ILP's memory expressions against the simulator, and the simulator against measurement.

The ILP-against-simulator tests take workspace that is the same on every machine: the table
recorded in tests/data (`recorded`: this repository's CPU, measured once) or seeded vectors.  The
simulator-against-allocator tests measure the workspace on the machine that runs them, as they
measure the peak (the same machine on both sides)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from ci import skip_unless_long
import torch

from monet.capture import capture
from monet.executor import ScheduleError, build_modules, emit_backward
from monet.profiling.measure import measure_iteration_peak, output_grad
from monet.profiling.costs import analytic_costs, costs_for
from monet.profiling.profiler import profile_costs
from monet.matrices import schedule_from_matrices
from monet.simulate import simulate
from monet.solution import Schedule, Stage
from monet.solver import formulation
from monet.solver.repair import repair
from monet.solver.solve import memory_model
from monet.wrapper import scheduled_module
from monet.zoo.models import get_model
from recorded import recorded_costs
from usernet import UserNet


def _model(name: str):
    """(model, input) of a test case, seeded: UserNet or a small ResNet-50."""
    torch.manual_seed(0)
    if name == "user":
        return UserNet(), torch.randn(4, 3, 16, 16)
    return get_model("resnet50", base_width=4, layers=(1, 1, 1, 1), num_classes=10), torch.randn(4, 3, 32, 32)


def _costs(graph, workspace):
    """`CostArrays` of ``graph``: analytic times, ``workspace`` (N + T,) bytes per forward then
    backward node."""
    table = analytic_costs(graph)
    table["workspace_bytes"] = np.asarray(workspace)
    return costs_for(graph, table)


def _measured_workspace(model, x, graph):
    """(N + T,) workspace bytes the CPU profiler measures on this machine."""
    return profile_costs(model, x, graph, "cpu", repeats=1, warmup=0, progress=False)["workspace_bytes"].values


@pytest.fixture(scope="module", params=["user", "resnet50"])
def case(request):
    """(model, x, graph, costs, memory model) with the workspace recorded in tests/data."""
    model, x = _model(request.param)
    graph = capture(model, x)
    costs = _costs(graph, recorded_costs(f"memory_model-{request.param}", model, x, graph)["workspace_bytes"].values)
    return model, x, graph, costs, memory_model(graph, costs)


def _random_schedules(graph, mem, n, seed=0, keep_fraction=(0.1, 0.9)):
    """(S (T, G), R (T, N)) of ``n`` repaired random schedules, each keeping a fraction of the groups
    drawn uniformly from ``keep_fraction``."""
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    rng = np.random.default_rng(seed)
    for _ in range(n):
        keep = rng.random((P.T, P.G)) < rng.uniform(*keep_fraction)
        yield repair(graph, mem, keep, P.allow_s)


def _out_of_place(graph, mem, S, R):
    """The schedule of (S (T, G), R (T, N)) run out of place (`Schedule.inplace` False): what the
    ILP's rows model.  In place (every solved schedule's default) the executor overwrites dead
    inputs, which only lowers the peak (`test_in_place_only_lowers_the_peak`)."""
    sched = schedule_from_matrices(graph, mem.group_to_node(S), R)
    sched.inplace = False
    return sched


def test_in_place_only_lowers_the_peak(case):
    """Schedules run in place (the default) peak at or under the same schedules out of place, and
    so under the ILP's rows (on these models' candidates the peak is where nothing is overwritten:
    equal; with `_workspaces`' ``sparse-0`` on UserNet in place was 6 % lower)."""
    from monet.solver.repair import repaired_candidates

    _, _, graph, costs, mem = case
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    for S, R, ilp_peak, _ in repaired_candidates(graph, mem, None, P.allow_s):
        out = simulate(graph, *build_modules(graph, _out_of_place(graph, mem, S, R)),
                       costs.fwd_workspace, costs.bwd_workspace).peak_bytes
        sched = schedule_from_matrices(graph, mem.group_to_node(S), R)
        assert sched.inplace
        inplace = simulate(graph, *build_modules(graph, sched), costs.fwd_workspace, costs.bwd_workspace).peak_bytes
        assert inplace <= out <= ilp_peak + 1


def test_ilp_memory_bounds_simulator(case):
    """On many schedules the ILP's peak is >= the simulated one (so fitting the ILP fits the budget)."""
    _, _, graph, costs, mem = case
    for S, R in _random_schedules(graph, mem, 25):
        sched = schedule_from_matrices(graph, mem.group_to_node(S), R)
        fw, bw = build_modules(graph, sched)
        sim = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace)
        assert sim.peak_bytes <= mem.peak(S, R) + 1
        assert sim.fwd_peak_bytes <= mem.fwd_peak(S[0]) + 1


def test_ilp_memory_tight_on_checkpoint_schedules(case):
    """On checkpoint schedules (every k-th group kept, the rest recomputed in each stage that reads
    it: long recomputation chains) the ILP's peak bounds the simulator's and is within 5 % of it.
    Counting every recomputed value to the end of its stage overstated such peaks by up to 2x on
    ResNet-50, and counting a recomputed node's input as dead while the node runs understated them."""
    from monet.solver.repair import repaired_candidates

    _, _, graph, costs, mem = case
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    cands = repaired_candidates(graph, mem, None, P.allow_s)
    assert len(cands) >= 4
    for S, R, ilp_peak, _ in cands:
        fw, bw = build_modules(graph, _out_of_place(graph, mem, S, R))
        sim = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes
        assert sim <= ilp_peak + 1
        assert ilp_peak <= 1.05 * sim, (ilp_peak, sim)


@pytest.fixture(scope="module", params=["user", "resnet50"])
def analytic_case(request):
    """The graph of a `case` model (its workspace is up to the test: no measurement)."""
    return capture(*_model(request.param))


def _workspaces(graph, kind: str) -> np.ndarray:
    """(N + T,) workspace bytes per forward then backward node, the same on every machine.

    ``zero``: none.  ``issue36``: 2,400 bytes on the first backward node of a convolution, nothing else:
    on UserNet the ILP said 288,376 bytes for a simulated 252,760 on one checkpoint schedule, the
    figures of the machine where `test_ilp_memory_tight_on_checkpoint_schedules` failed (its
    measured workspace is not known; this one gives the same pair).  ``sparse-<seed>``: 0-3x a
    node's output bytes on a random 40 % of the nodes.  ``one-<seed>``: twice the largest output
    on one random node, nothing elsewhere.
    """
    N, T = len(graph.fwd), len(graph.bwd)
    out = np.array([n.out_bytes for n in graph.fwd + graph.bwd], dtype=float)
    ws = np.zeros(N + T)
    if kind == "issue36":
        ws[N + min(n.id for n in graph.bwd if n.op == "aten.convolution_backward.default")] = 2400
    elif kind.startswith("sparse-"):
        rng = np.random.default_rng(int(kind.split("-")[1]))
        ws = out * rng.uniform(0, 3, N + T) * (rng.random(N + T) < 0.4)
    elif kind.startswith("one-"):
        rng = np.random.default_rng(int(kind.split("-")[1]))
        ws[rng.integers(N + T)] = 2 * out.max()
    return np.round(ws).astype(np.int64)


@pytest.mark.parametrize("kind", ["zero", "issue36", "sparse-0", "sparse-1", "sparse-2", "one-0", "one-1"])
def test_ilp_memory_tight_on_checkpoint_schedules_for_any_workspace(analytic_case, kind):
    """`test_ilp_memory_tight_on_checkpoint_schedules` with workspace vectors that do not depend on
    the machine (`_workspaces`).  Its measured workspace passed here and failed on another
    machine: (288376, 252760), +14 %.  The rows counted a kept value through its whole stage, a
    recomputed BatchNorm's output while its backward node (which reads only its statistics) ran,
    and a recomputed value until its last forward reader where the stage does not recompute that
    reader: +15 % on UserNet with no workspace at all, hidden where a larger workspace put the
    peak in another stage."""
    from monet.solver.repair import repaired_candidates

    graph = analytic_case
    costs = _costs(graph, _workspaces(graph, kind))
    mem = memory_model(graph, costs)
    cands = repaired_candidates(graph, mem, None, formulation.allowed(mem, "normal")[2])
    assert len(cands) >= 4
    for S, R, ilp_peak, _ in cands:
        fw, bw = build_modules(graph, _out_of_place(graph, mem, S, R))
        sim = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes
        assert sim <= ilp_peak + 1, (ilp_peak, sim)
        assert ilp_peak <= 1.05 * sim, (ilp_peak, sim)


def test_ilp_rows_are_the_memory_model(analytic_case):
    """The ILP's memory rows (`formulation.Problem`, with its helper variables) give, for a schedule's S and
    R fixed, the peak `MemoryModel.peak` computes (the two are written apart: linear terms with
    helpers, and arrays), on checkpoint and random schedules with a workspace."""
    import cvxpy as cp

    from monet.solver.repair import repaired_candidates

    graph = analytic_case
    costs = _costs(graph, _workspaces(graph, "sparse-3"))
    mem = memory_model(graph, costs)
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal", relax=True)
    schedules = [(S, R) for S, R, _, _ in repaired_candidates(graph, mem, None, P.allow_s)]
    schedules += list(_random_schedules(graph, mem, 4, seed=7))
    for S, R in schedules:
        fixed = [P.s == S.ravel()[P.s_idx].astype(float), P.r == R.ravel()[P.r_idx].astype(float)]
        lp = cp.Problem(cp.Minimize(P.budget_var), P.cons + P.memory_constraints(P.budget_var) + fixed)
        lp.solve(solver=cp.HIGHS)
        assert lp.status == cp.OPTIMAL
        assert lp.value * P.scale == pytest.approx(mem.peak(S, R), rel=1e-6)


def test_ilp_memory_bounds_long_recomputation_chains_at_full_scale():
    """ResNet-50 at MONeT's batch 184 (captured on the meta device, analytic costs): on checkpoint
    schedules whose peak is inside a recomputation chain, the ILP's peak bounds the simulator's
    and is within 5 % of it.  (A row that counted a recomputed node's input as dead while the node
    runs understated one of these by 15 %.)"""
    from monet.solver.repair import repaired_candidates
    from monet.zoo.build import capture_config, zoo_costs

    graph = capture_config("resnet50", 184)
    costs = zoo_costs(graph).costs
    mem = memory_model(graph, costs)
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    for S, R, ilp_peak, _ in repaired_candidates(graph, mem, None, P.allow_s)[-3:]:
        fw, bw = build_modules(graph, _out_of_place(graph, mem, S, R))
        sim = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes
        assert sim <= ilp_peak + 1
        assert ilp_peak <= 1.05 * sim, (ilp_peak, sim)


def test_forward_expression_exact_when_everything_is_kept(case):
    _, _, graph, costs, mem = case
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "none")
    S, R = repair(graph, mem, np.ones((P.T, P.G), dtype=bool), P.allow_s)
    fw, bw = build_modules(graph, _out_of_place(graph, mem, S, R))
    sim = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace)
    assert sim.fwd_peak_bytes == mem.fwd_peak(S[0])


def test_simulator_equals_measurement(case, request):
    """The simulator's peak, with the workspace measured here, equals the allocator's on random
    schedules (within 2 %, usually exact)."""
    if "resnet50" in request.node.callspec.id:
        skip_unless_long("ResNet-50's random schedules measured", 27, "the short suite measures them on UserNet")
    model, x, graph, _, mem = case
    costs = _costs(graph, _measured_workspace(model, x, graph))
    g = output_grad(model, x)
    for S, R in _random_schedules(graph, mem, 3, seed=1):
        sched = schedule_from_matrices(graph, mem.group_to_node(S), R)
        fw, bw = build_modules(graph, sched)
        predicted = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes
        measured = measure_iteration_peak(scheduled_module(copy.deepcopy(model), lambda _g, s=sched: s), x, g)
        assert abs(predicted - measured) <= 0.02 * measured, (predicted, measured)


def test_invalid_schedule_refused(case):
    _, _, graph, _, _ = case
    nothing = Schedule(saved=(), stages=[Stage(backward=t) for t in range(len(graph.bwd))])
    with pytest.raises(ScheduleError, match="neither keeps nor recomputes"):
        emit_backward(graph, nothing)


@pytest.fixture(scope="module")
def full_case(case):
    """The case's graph with every CPU implementation as an option: the base's workspace recorded, the
    variants' costs measured here (the tests below assert bounds, which hold whatever the numbers)."""
    from monet.profiling.variant_costs import hybrid_cost_fn
    from monet.solver.solve import full_model

    model, x, graph, costs, _ = case
    table = analytic_costs(graph)
    table["workspace_bytes"] = costs.fwd_workspace.tolist() + costs.bwd_workspace.tolist()
    options, mem = full_model(graph, costs, "full", "cpu", hybrid_cost_fn(model, x, graph, table))
    return model, x, graph, costs, options, mem


def test_ilp_memory_bounds_simulator_with_implementations(full_case):
    """For random implementation choices M and random schedules, the joint model's peak (with M)
    is >= the simulated peak of the graph with those implementations; with PyTorch's
    implementations everywhere its forward expression is exact."""
    from monet.solver.choices import chosen_graph, chosen_impls
    from monet.solver.solve import memory_model

    _, _, graph, costs, options, mem = full_case
    assert options and mem.n_options == len(options)
    allow_s = formulation.Problem(mem, np.zeros(len(graph.fwd)), "full").allow_s
    rng = np.random.default_rng(3)
    for trial in range(12):
        M = np.zeros(mem.n_options)
        for opts in mem.choices:
            M[opts[0] if trial == 0 else rng.choice(opts)] = 1
        g, c = chosen_graph(graph, costs, options, chosen_impls(options, M))
        m = memory_model(g, c)
        P = formulation.Problem(m, np.zeros(len(g.fwd)), "normal" if trial else "none")
        keep = rng.random((P.T, P.G)) < rng.uniform(0.1, 0.9) if trial else np.ones((P.T, P.G), dtype=bool)
        S, R = repair(g, m, keep, P.allow_s)
        S_nodes = m.group_to_node(S)
        sched = schedule_from_matrices(g, S_nodes, R)
        sched.impl = dict(g.impls)
        fw, bw = build_modules(g, sched)
        sim = simulate(g, fw, bw, c.fwd_workspace, c.bwd_workspace)
        # the joint model's groups: those of kept nodes that exist under the chosen options
        S_joint = mem.node_to_group(S_nodes) & allow_s & ((mem.group_option < 0) | (M[mem.group_option] > 0.5))
        assert sim.peak_bytes <= mem.peak(S_joint, R, M) + 1, trial
        if trial == 0:  # the base graph: the same values kept as the normal model keeps
            S_exact = np.zeros_like(S_joint)
            for v, grp in m.group_of.items():
                S_exact[:, mem.group_of[v]] = S[:, grp]
            assert sim.fwd_peak_bytes == mem.fwd_peak(S_exact[0], M)
            assert sim.peak_bytes <= mem.peak(S_exact, R, M) + 1


def test_local_search_removes_recomputation_that_memory_allows(case):
    """From a checkpoint schedule, `improve` with the plain peak as budget ends with nothing
    recomputed (keeping everything fits there), and with a budget below the plain peak it returns
    a cheaper schedule that still fits."""
    import time

    from monet.solver.repair import improve, repaired_candidates
    from monet.solver.solve import eager_peak

    _, _, graph, costs, mem = case
    P = formulation.Problem(mem, costs.fwd_recompute, "normal")
    eager = eager_peak(graph, costs)
    S, R, peak, cost = repaired_candidates(graph, mem, None, P.allow_s, costs.fwd_recompute)[2]
    assert cost > 0
    S2, R2, c2 = improve(graph, mem, S, R, eager, costs.fwd_recompute, P.allow_s, time.perf_counter() + 60)
    assert c2 == 0 and not R2.any() and mem.peak(S2, R2) <= eager
    budget = (peak + eager) / 2
    S3, R3, c3 = improve(graph, mem, S, R, budget, costs.fwd_recompute, P.allow_s, time.perf_counter() + 60)
    assert c3 < cost and mem.peak(S3, R3) <= budget
    assert c3 == float(np.asarray(costs.fwd_recompute) @ R3.sum(axis=0))


def test_joint_model_counts_what_the_chosen_implementations_hold():
    """The joint model with the implementations M fixed counts, for the schedule that keeps what
    M's backward nodes read, the peak of the graph built with those implementations.  MobileNetV2's
    in-place ReLU6 makes the base graph clone each ReLU6 input for its backward; the 1-bit mask
    variants hold no clone, and a model that took the backward values from the base graph alone
    counted them anyway (0.957 of the plain peak for 0.663 at full scale)."""
    from monet.solver.choices import chosen_graph
    from monet.solver.repair import repair
    from monet.solver.solve import analytic_cost_fn, eager_peak, full_model, lean_impls, memory_model
    from monet.zoo.models import get_model

    torch.manual_seed(0)
    graph = capture(get_model("mobilenet_v2", width_mult=0.25, num_classes=10), torch.randn(2, 3, 32, 32))
    costs = costs_for(graph, analytic_costs(graph))
    options, joint = full_model(graph, costs, "inplace_conv_multiway_newnode", "cpu", analytic_cost_fn())
    impls = lean_impls(options, cheap=True)
    assert any(v.startswith("hardtanh") or "mask" in v for v in impls.values())
    M = np.zeros(len(options))
    for choice in joint.choices:
        want = impls.get(options[choice[0]].key, "default")
        M[[o for o in choice if options[o].impl == want][0]] = 1
    T, G = len(graph.bwd), len(joint.groups)
    last = np.full(G, -1)
    for t, g, o in joint.reads:
        if o < 0 or M[o] > 0.5:
            last[g] = max(last[g], t)
    S = np.arange(T)[:, None] <= last[None, :]
    none = np.zeros((T, len(graph.fwd)), dtype=bool)
    g, c = chosen_graph(graph, costs, options, impls)
    mem = memory_model(g, c)
    Sc, Rc = repair(g, mem, np.ones((T, len(mem.groups)), dtype=bool), formulation.Problem(mem, c.fwd_recompute,
                                                                                    "normal").allow_s)
    eager = eager_peak(graph, costs)
    assert joint.peak(S, none, M) == pytest.approx(mem.peak(Sc, Rc), rel=0.01, abs=0.01 * eager)


class _Logits(torch.nn.Module):
    """A GPT-style head: a 3-D input times a matrix, which AOTAutograd writes as ``mm`` followed
    by ``aten._unsafe_view`` (a view whose schema declares no alias)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 2048) * 0.05)

    def forward(self, x):
        return (x @ self.w).amax(-1)


def test_unsafe_view_is_a_view_not_an_allocation():
    """The logits are stored once: the simulated keep-everything peak equals the measured one
    (within 2 %); counting ``_unsafe_view`` as an allocation made it 1.5x here."""
    torch.manual_seed(0)
    model, x = _Logits(), torch.randn(4, 64, 32)
    graph = capture(model, x)
    assert "aten._unsafe_view.default" in "\n".join(graph.summary)
    assert not any(n.op == "aten._unsafe_view.default" for n in graph.fwd + graph.bwd)
    costs = _costs(graph, _measured_workspace(model, x, graph))
    mem = memory_model(graph, costs)
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    S, R = repair(graph, mem, np.ones((P.T, P.G), dtype=bool), P.allow_s)
    sched = schedule_from_matrices(graph, mem.group_to_node(S), R)
    fw, bw = build_modules(graph, sched)
    predicted = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes
    measured = measure_iteration_peak(scheduled_module(copy.deepcopy(model), lambda _g, s=sched: s), x,
                                      output_grad(model, x))
    assert abs(predicted - measured) <= 0.02 * measured, (predicted, measured)


def test_ilp_memory_bounds_simulator_on_offloads(case):
    """With offload to host memory a choice (a bandwidth that hides every copy), on random schedules
    offloading random subsets of the groups they may offload (`OffloadModel.effective`), the ILP's
    peak is >= the reference peak (`monet.solver.finish.simulated_peak_fn`, the executor's modules
    simulated), and offloading never raises the reference peak."""
    from monet.solver.finish import simulated_peak_fn

    _, _, graph, costs, _ = case
    mem = memory_model(graph, costs, 1e12)
    peak_of = simulated_peak_fn(graph, costs, mem)
    rng = np.random.default_rng(5)
    tried = 0
    for S, R in _random_schedules(graph, mem, 12, seed=4, keep_fraction=(0.5, 1.0)):  # kept through windows
        allowed = mem.offload.effective(S, R)
        O = allowed & (rng.random(allowed.shape) < 0.6)
        tried += bool(O.any())
        sim = peak_of(S, R, O=O)
        assert sim <= mem.peak(S, R, O=O) + 1
        assert sim <= peak_of(S, R, O=np.zeros_like(O))
    assert tried >= 3, "the random schedules should offload something"
