"""The one call as a user meets it: errors in the caller's terms, the smallest budget found once,
the time limit shared by every step, progress on stderr or nothing at all."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import monet
from monet import terms
from monet.plan import forget_plans, prepare
from monet.solver.ilp import InfeasibleBudgetError
from ci import HANG_GUARD_S
from usernet import UserNet, labelled_batch

SHAPE = (3, 16, 16)
BATCH = 8


@pytest.fixture(scope="module")
def batch():
    return labelled_batch(BATCH, SHAPE)


@pytest.fixture
def costs_dir(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "front-door-costs"  # measured once for the module's calls


def _optimize(model, batch, costs_dir, **kw):
    x, y = batch
    kw.setdefault("time_limit", 10)
    kw.setdefault("progress", False)
    return monet.optimize(model, x, loss_fn=F.cross_entropy, target=y, cache_dir=costs_dir, cost="analytic", **kw)


# ----------------------------------------------------------------------------------------------
# errors in the caller's terms
# ----------------------------------------------------------------------------------------------


def test_infeasible_budget_from_python_names_the_arguments(batch, costs_dir):
    forget_plans()
    with pytest.raises(InfeasibleBudgetError) as info:
        _optimize(UserNet(), batch, costs_dir, budget=1000)
    message = str(info.value)
    assert f"budget={info.value.min_budget_bytes}" in message
    assert 'budget="min"' in message and 'if_infeasible="smallest"' in message
    assert "--" not in message, message


def test_infeasible_budget_from_the_cli_names_the_flags(tmp_path, capsys):
    from monet.cli import main

    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent("""\
        from torch import nn
        def build():
            return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
        """))
    code = main(["solve", f"{path}:build", "--batch-size", "2", "--input-shape", "3,16,16", "--budget", "1KB",
                 "--cost", "analytic", "--time-limit", "5", "-o", str(tmp_path / "never.pkl")])
    err = capsys.readouterr().err
    assert code == 2
    line = next(line for line in err.splitlines() if line.startswith("monet: error:"))
    assert "--budget" in line and "--min-budget" in line
    assert "budget=" not in line and "if_infeasible" not in line, line


@pytest.mark.parametrize("where", ["python", "cli"])
def test_every_advice_site_speaks_one_language(where):
    """Each error that advises an argument names it as the caller spells it (`monet.terms`)."""
    from monet import mixed_precision
    from monet.impls.batchnorm import ZeroGammaError, batch_norm_backward_from_output
    from monet.profiling.sources import device_spec

    def messages():
        out = [str(InfeasibleBudgetError(10, 2000, "normal")),
               mixed_precision.mismatch_message(None, ("cuda", "bfloat16")),
               mixed_precision.mismatch_message(("cuda", "bfloat16"), None),
               mixed_precision.mismatch_message(("cuda", "bfloat16"), ("cpu", "bfloat16"))]
        w = torch.zeros(2)
        with pytest.raises(ZeroGammaError) as e:
            batch_norm_backward_from_output(torch.randn(2, 2, 3), torch.randn(2, 2, 3), w, torch.zeros(2),
                                            torch.ones(2), 1e-5, [True, True, True])
        out.append(str(e.value))
        if not torch.cuda.is_available():  # no GPU: the analytic model for "cuda" needs a preset
            with pytest.raises(ValueError) as e:
                device_spec(None, "cuda")
            out.append(str(e.value))
        return out

    if where == "cli":
        with terms.cli_terms():
            found = messages()
        for m in found:
            assert re.search(r"--[a-z]", m), m
            assert not re.search(r"\b(budget|mode|gpu_spec|cost|autocast_dtype)=", m), m
    else:
        found = messages()
        for m in found:
            assert not re.search(r"(?<![\w-])--[a-z]", m), m


# ----------------------------------------------------------------------------------------------
# the smallest budget, found once
# ----------------------------------------------------------------------------------------------


def test_min_after_an_infeasible_call_reuses_what_it_learned(batch, costs_dir, monkeypatch):
    import monet.capture

    forget_plans()
    torch.manual_seed(0)
    model = UserNet()
    with pytest.raises(InfeasibleBudgetError) as info:
        _optimize(model, batch, costs_dir, budget=1000)
    least = info.value.min_budget_bytes
    captures = []
    real = monet.capture.capture

    def counted(*a, **k):
        captures.append(1)
        return real(*a, **k)

    monkeypatch.setattr(monet.capture, "capture", counted)
    wrapped = _optimize(model, batch, costs_dir, budget="min")
    assert not captures
    meta = wrapped.solution.meta
    assert meta.budget_bytes >= least  # the knee: the smallest budget worth its recomputation
    if meta.budget_bytes == least:
        assert meta.solver.endswith("+min-budget")  # the kept search's schedule
    # once taken, the kept plan is gone: the next call captures as usual
    again = _optimize(model, batch, costs_dir, budget="min")
    assert captures == [1] and again.solution.meta.budget_bytes <= least * 1.01


def test_if_infeasible_smallest_solves_at_the_budget_the_error_names(batch, costs_dir):
    forget_plans()
    torch.manual_seed(0)
    model = UserNet()
    with pytest.raises(InfeasibleBudgetError) as info:
        _optimize(model, batch, costs_dir, budget=1000)
    wrapped = _optimize(model, batch, costs_dir, budget=1000, if_infeasible="smallest")
    assert wrapped.solution.meta.budget_bytes == info.value.min_budget_bytes
    x, y = batch
    assert torch.isfinite(wrapped(x, target=y))


def test_kept_plan_is_for_the_same_inputs_only(batch, costs_dir):
    forget_plans()
    torch.manual_seed(0)
    model = UserNet()
    with pytest.raises(InfeasibleBudgetError):
        _optimize(model, batch, costs_dir, budget=1000)
    x, y = batch
    plan = prepare(model, x[:4], loss_fn=F.cross_entropy, target=y[:4], cost="analytic", progress=False, reuse=True)
    assert plan.inputs.first.shape[0] == 4  # another batch: captured anew, not the kept plan


# ----------------------------------------------------------------------------------------------
# one deadline, progress
# ----------------------------------------------------------------------------------------------


def test_calibration_that_does_not_fit_the_time_limit_is_skipped(batch, tmp_path, capsys, monkeypatch):
    """Where the schedule is timed (measured CPU costs), the timing shares the call's time limit:
    with too little left it is not run, and the log says so.  The timing's estimate is set to an
    hour, so that no machine is fast enough to fit it in the limit."""
    from monet.profiling import calibration

    monkeypatch.setattr(calibration, "timing_seconds", lambda *a, **k: 3600.0)
    x, y = batch
    torch.manual_seed(0)
    plan = prepare(UserNet(), x, loss_fn=F.cross_entropy, target=y, progress=True, cache_dir=tmp_path)
    assert plan.calibrates
    capsys.readouterr()
    sol = plan.solve("70%", time_limit=0.5)
    err = capsys.readouterr().err
    assert "not timed: the time limit leaves" in err
    assert "calibrated" not in "+".join(sol.meta.cost_source if isinstance(sol.meta.cost_source, list)
                                        else [str(sol.meta.cost_source)])


def test_a_long_capture_shortens_the_solve_so_the_call_keeps_to_twice_the_limit():
    """`optimize`'s solve gets its whole time limit while the capture and the costs leave room,
    what is left of 2 x time_limit (less the margin for wrapping) after a long capture, and never
    less than its floor."""
    from monet.plan import CALL_LIMIT_FACTOR, CALL_MARGIN, MIN_SOLVE_FRACTION, solve_limit

    assert solve_limit(60, 10) == 60
    assert solve_limit(60, 91) == pytest.approx((CALL_LIMIT_FACTOR - CALL_MARGIN) * 60 - 91)
    assert 91 + solve_limit(60, 91) < CALL_LIMIT_FACTOR * 60
    assert solve_limit(60, 500) == MIN_SOLVE_FRACTION * 60


def test_progress_shows_the_phases_with_their_times(batch, costs_dir, capsys):
    forget_plans()
    capsys.readouterr()
    _optimize(UserNet(), batch, costs_dir, budget="min", progress=True)
    err = capsys.readouterr().err
    for phase in ("capture", "costs", "solve"):
        assert re.search(rf"{phase} \d+\.\d s", err), (phase, err[-2000:])


def test_quiet_call_prints_nothing_at_all(tmp_path):
    """``progress=False`` on a tiny model with measured costs (the profiler runs: torch 2.13's
    kineto printed two ``USDT:`` lines per start and stop): stderr and stdout stay empty, seen at the
    file descriptors, in a process of its own."""
    script = textwrap.dedent(f"""\
        import sys, torch, torch.nn.functional as F
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
        import monet
        from usernet import UserNet
        torch.manual_seed(0)
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        monet.optimize(UserNet(), x, budget="80%", loss_fn=F.cross_entropy, target=y, time_limit=5,
                       progress=False, cache_dir={str(tmp_path)!r})
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "" and proc.stdout == "", proc.stderr[-3000:]


def test_the_api_and_its_errors_are_monets():
    """``import monet`` shows its API: the calls, the wrappers and every error type."""
    import monet

    for name in ("optimize", "prepare", "MONeTWrapper", "WithLoss", "BucketedWrapper", "PiecewiseModule",
                 "InfeasibleBudgetError", "SolutionMismatchError", "SolutionFileError", "CaptureError",
                 "GraphBreakError", "AutocastMismatchError", "MonetWarning"):
        assert name in monet.__all__ and name in dir(monet)
        assert getattr(monet, name) is not None
    assert issubclass(monet.InfeasibleBudgetError, ValueError) and issubclass(monet.GraphBreakError, monet.CaptureError)
    for fn in (monet.optimize, monet.MONeTWrapper, monet.MONeTWrapper.__init__, monet.MONeTWrapper.forward):
        assert fn.__doc__ and len(fn.__doc__) > 200, fn


def test_byte_figures_tell_two_budgets_apart():
    from monet.solver.ilp import InfeasibleBudgetError

    message = str(InfeasibleBudgetError(3_970_000, 4_710_000, "normal"))
    assert "3.79 MiB" in message and "4.49 MiB" in message and "GiB" not in message


def test_an_infeasible_budget_names_the_lp_bound_only_where_it_does_not_contradict_the_smallest():
    """The LP bound is of the ILP's memory, above the simulated peak: where the smallest budget
    found is below it, saying that nothing fits below the bound would contradict it."""
    from monet.solver.ilp import InfeasibleBudgetError

    below = str(InfeasibleBudgetError(1_000_000, 1_911_768, "normal", lower_bytes=1_947_672))
    assert "1911768" in below and "LP relaxation" not in below
    above = str(InfeasibleBudgetError(1_000_000, 2_000_000, "normal", lower_bytes=1_947_672))
    assert "no schedule fits below 1947672 bytes" in above
