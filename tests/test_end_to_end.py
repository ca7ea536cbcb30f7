"""The whole job on every zoo model, on CPU: solve at budgets, train with the wrapper, compare.

Each zoo architecture is built narrow and fed small batches so that activations (what monet
saves) dominate the memory, as they do at MONeT's full sizes, and the suite stays fast.  Costs:
analytic times, workspace measured by a quick CPU profile (oneDNN's reorders are real
temporaries that the measured peak sees).

For each model and each budget (80 % and 50 % of the simulated plain-PyTorch peak, and the
smallest feasible budget of ``normal`` mode).  The workspace is measured on the machine that runs the
tests (the measured peak is held to a prediction made with it), so whether a fraction is feasible
depends on the machine: a fraction below the smallest feasible budget that this run's search found
is solved at that budget instead (refusals of infeasible budgets are tested below the LP bound, in
tests/test_solver_fast_path.py).  What recomputation saves is asserted on the workspace recorded
in tests/data (`recorded`), the same on every machine:
* gradients and BatchNorm buffers are bitwise equal to plain PyTorch's;
* the measured peak (allocator level) is <= the budget;
* the predicted peak is within 2 % of the measured one.

Full mode (``inplace_conv_multiway_newnode``: operator implementations chosen with the
checkpoints), on the same models: its smallest feasible budget found is below the plain peak
(VGG-16: at most); at 80 % (or that budget, if larger) and at that budget the measured peak fits,
the prediction is within 2 % and gradients are within 1e-5 of PyTorch's (other kernels round
differently).  Its iteration time against normal mode's is not asserted (see
test_full_mode_budget_fraction).
"""
from __future__ import annotations

import copy

import pytest
from ci import SHORT, skip_unless_long
import torch

from monet.capture import capture
from monet.profiling.measure import compare_gradients, measure_iteration_peak, output_grad
from monet.profiling.costs import analytic_costs, costs_for
from monet.profiling.profiler import profile_costs
from monet.profiling.variant_costs import hybrid_cost_fn
from monet.solver.solve import eager_peak, min_budget, solve
from monet.wrapper import MONeTWrapper
from monet.zoo.models import get_model
from recorded import recorded_costs

# name -> (factory kwargs of a narrow variant, input shape with batch)
CONFIGS = {
    "resnet50": (dict(base_width=8, num_classes=10), (8, 3, 64, 64)),
    "vgg16": (dict(width=4, hidden=64, num_classes=10), (4, 3, 64, 64)),
    "mobilenet_v2": (dict(width_mult=0.25, num_classes=10), (8, 3, 64, 64)),
    "googlenet": (dict(width_div=8, num_classes=10), (8, 3, 64, 64)),
    "unet": (dict(base_channels=4), (2, 3, 64, 64)),
    "gpt2-small": (dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64), (4, 64)),
}
TIME_LIMIT = 4  # seconds per solve: the best schedule found by then is used
# HiGHS keeps to its time limit; CBC's (through cvxpy) bounds only its branch and bound, and its
# preprocessing and root cuts take several times TIME_LIMIT here (the short suite's budget).  CBC, the
# default, is exercised by tests/test_cli.py and tests/test_wrapper.py.
SOLVER = "HIGHS"
# the short suite solves at 50 % only
FRACTIONS = (0.5,) if SHORT else (0.8, 0.5)
FULL = "inplace_conv_multiway_newnode"
FULL_FRACTIONS = (0.8,)
# Graphs whose joint ILP exceeds `solver.formulation.LARGE` variables: their full-mode cases take 1.5-2
# minutes each (variant graphs, two LP relaxations, local searches), so the short suite
# runs full mode on VGG-16 and U-Net only (the smallest budget on U-Net only); MONET_LONG_TESTS=1
# runs all six.
LARGE_GRAPHS = {"resnet50", "googlenet", "mobilenet_v2", "gpt2-small"}


# the two slowest to capture, profile and check: seconds of CPU (2 cores) for all their tests in the short suite
SLOW_IN_SHORT = {"googlenet": 130, "mobilenet_v2": 140}


def _skip_large_in_short(setup):
    if setup["name"] in LARGE_GRAPHS:
        skip_unless_long("full mode on a large graph", covered="the short suite runs full mode on VGG-16 and U-Net")


def make_input(name, shape):
    gen = torch.Generator().manual_seed(0)
    if name == "gpt2-small":
        return torch.randint(0, CONFIGS[name][0]["vocab_size"], shape, generator=gen)
    return torch.randn(shape, generator=gen)


@pytest.fixture(scope="module", params=list(CONFIGS))
def setup(request):
    name = request.param
    if name in SLOW_IN_SHORT:
        skip_unless_long(f"{name} end to end", SLOW_IN_SHORT[name], "the short suite runs ResNet-50 (residual adds), U-Net "
                   "(concatenations), VGG-16 and GPT-2; tests/test_zoo.py loads and fits MobileNetV2's zoo entry")
    kwargs, shape = CONFIGS[name]
    torch.manual_seed(0)
    model = get_model(name, **kwargs)
    x = make_input(name, shape)
    graph = capture(model, x)
    table = analytic_costs(graph)
    table["workspace_bytes"] = profile_costs(model, x, graph, "cpu", repeats=1, warmup=0,
                                             progress=False)["workspace_bytes"].values
    costs = costs_for(graph, table)
    g = output_grad(model, x)
    rec = analytic_costs(graph)
    rec["workspace_bytes"] = recorded_costs(f"end_to_end-{name}", model, x, graph)["workspace_bytes"].values
    recorded = costs_for(graph, rec)
    return dict(name=name, model=model, x=x, graph=graph, costs=costs, g=g, eager=eager_peak(graph, costs),
                cost_fn=hybrid_cost_fn(model, x, graph, table), recorded=recorded)


def _wrapped(setup, sol):
    """MONeT's wrapper of a copy of the model, whose first training call traces the capture's
    export rebound to the copy (`MONeTWrapper.offer_export`, as `monet.optimize`'s wrapper does)
    instead of exporting the model again: the narrow ResNet-50's export takes about 10 s on 2
    cores.  Exporting in the wrapper is tested by tests/test_wrapper.py and the saved-solution
    examples of tests/test_doc_examples.py."""
    wrapper = MONeTWrapper(copy.deepcopy(setup["model"]), sol, tuple(setup["x"].shape[1:]))
    wrapper.offer_export(setup["graph"], source=setup["model"])
    return wrapper


def _check(setup, budget, sol=None):
    model, x, g = setup["model"], setup["x"], setup["g"]
    if sol is None:
        sol = solve(setup["graph"], setup["costs"], budget, "normal", time_limit=TIME_LIMIT, solver=SOLVER)
    # one wrapper for both: gradients and buffers first, from the copy's fresh weights and
    # statistics; then the peak (`measure_iteration_peak` starts from parameter gradients None)
    wrapper = _wrapped(setup, sol)
    rel, grads_equal, buffers_equal = compare_gradients(lambda: copy.deepcopy(model), lambda: wrapper, x, g)
    measured = measure_iteration_peak(wrapper, x, g)
    if sol.schedule.impl:  # other kernels: the same gradients up to rounding
        assert rel <= 1e-5, f"{setup['name']}: gradients differ from PyTorch by {rel:.3g} (relative)"
    else:
        assert grads_equal, f"{setup['name']}: gradients differ from PyTorch (max rel diff {rel:.3g})"
        assert buffers_equal, f"{setup['name']}: buffers (BatchNorm running statistics) differ"
    assert measured <= budget, f"{setup['name']}: measured peak {measured} > budget {budget}"
    predicted = sol.meta.predicted_peak_bytes
    assert abs(predicted - measured) <= 0.02 * measured, \
        f"{setup['name']}: predicted {predicted} vs measured {measured}"
    return sol


def test_keep_everything_prediction(setup):
    """The keep-everything schedule (mode none): simulated peak within 2 % of the measured one.

    (Plain eager PyTorch can be lower: its in-place ops (ReLU6 in MobileNetV2) overwrite their
    input, while AOTAutograd's functionalised graph allocates a new tensor; in-place
    implementations are a later mode.  BENCHMARKS.md lists both.)
    """
    sol = solve(setup["graph"], setup["costs"], None, "none", solver=SOLVER)
    wrapped = _wrapped(setup, sol)
    measured = measure_iteration_peak(wrapped, setup["x"], setup["g"])
    assert sol.meta.predicted_peak_bytes == setup["eager"]
    assert abs(setup["eager"] - measured) <= 0.02 * measured


def _least(setup, mode="normal", costs="costs"):
    """The smallest feasible budget the search finds in ``mode`` on this run's costs (``costs``:
    "recorded" for the recorded workspace; cached on the graph: each mode is searched once per
    model and costs, and test_min_budget checks that budget too)."""
    kw = dict(cost_fn=setup["cost_fn"]) if mode == FULL else {}
    least, _ = min_budget(setup["graph"], setup[costs], mode, time_limit=TIME_LIMIT, solver=SOLVER, **kw)
    return least


@pytest.mark.parametrize("fraction", FRACTIONS)
def test_budget_fraction(setup, fraction):
    """At ``fraction`` of the plain peak, or at the smallest feasible budget found where that is
    larger (see the module docstring): a schedule that fits, measured and predicted."""
    budget = max(int(setup["eager"] * fraction), _least(setup))
    sol = solve(setup["graph"], setup["costs"], budget, "normal", time_limit=TIME_LIMIT, solver=SOLVER)
    _check(setup, budget, sol)
    assert sol.meta.predicted_peak_bytes <= budget


def test_min_budget(setup):
    """The smallest feasible budget runs within budget with exact gradients.

    With the recorded workspace it is below the plain peak wherever recomputation can lower the
    peak; VGG-16's CPU peak sits in the backward of its first convolutions (their activations plus
    oneDNN's reorder workspace), which no recomputation lowers, so there the smallest budget is the
    plain peak.  With this machine's workspace that can be so on other models too (a large
    temporary where the plain peak is): there it is asserted at most the plain peak.
    """
    if setup["name"] in ("googlenet", "resnet50"):
        skip_unless_long(f"{setup['name']}'s smallest budget", 39, "the short suite runs U-Net's, VGG-16's and GPT-2's")
    least = _least(setup)
    assert least <= setup["eager"]
    _check(setup, least)
    recorded = _least(setup, costs="recorded")
    assert recorded <= eager_peak(setup["graph"], setup["recorded"])
    if setup["name"] != "vgg16":
        assert recorded < eager_peak(setup["graph"], setup["recorded"]), \
            "recomputation must save memory on this zoo model (recorded workspace)"


def _solve_full(setup, budget):
    return solve(setup["graph"], setup["costs"], budget, FULL, time_limit=TIME_LIMIT, cost_fn=setup["cost_fn"],
                 solver=SOLVER)


def test_full_mode_min_budget(setup):
    """Full mode's smallest budget found is below the plain peak where normal mode's is (on the same
    costs; VGG-16: at most), and its schedule at it runs within it with the right gradients.

    Whether it is below normal mode's is a question of solver time, not of correctness: both are
    searches stopped by a 4 s wall-clock limit on shared cores.  It was below on every model while
    the ILP counted every recomputed value to the end of its stage; with the exact memory model
    this narrow ResNet's normal-mode answer (4,848,728 bytes) beat full mode's (4,932,440), and
    GoogLeNet's did too (2,253,240 against 2,314,584).  `benchmarks/bench_solver.py` and BENCHMARKS.md
    compare the modes."""
    if setup["name"] == "vgg16":
        # its smallest budget in normal mode is its plain peak (test_min_budget), so here only
        # ``least <= plain`` is asserted; U-Net's asserts that full mode saves memory
        skip_unless_long("VGG-16's full-mode smallest budget", 25, "the short suite runs U-Net's")
    _skip_large_in_short(setup)
    least = _least(setup, FULL)
    assert least <= setup["eager"]
    if _least(setup) < setup["eager"]:  # where normal mode saves memory on these costs (test_min_budget)
        assert least < setup["eager"], f"{setup['name']}: full mode saves no memory ({least} bytes)"
    _check(setup, least, _solve_full(setup, least))


@pytest.mark.parametrize("fraction", FULL_FRACTIONS)
def test_full_mode_budget_fraction(setup, fraction):
    """As test_budget_fraction, in full mode (its own smallest budget found)."""
    _skip_large_in_short(setup)
    budget = max(int(setup["eager"] * fraction), _least(setup, FULL))
    sol = _solve_full(setup, budget)
    _check(setup, budget, sol)
    assert sol.meta.predicted_peak_bytes <= budget and sol.meta.mode == FULL
    # Not asserted: full mode's time against normal mode's.  Both are searches stopped by a 4 s
    # wall-clock limit, and on 2 shared cores full mode's PyTorch-kernel candidate gets less of
    # it (GoogLeNet and MobileNetV2 here: 2-14 % slower schedules than normal mode's, run to run);
    # `benchmarks/bench_solver.py` and BENCHMARKS.md compare the modes.
