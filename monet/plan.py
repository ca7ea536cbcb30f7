"""`monet.optimize` (this module's `optimize`): capture, cost, solve and wrap in one call, as ``torch.compile`` is one call.

    model = monet.optimize(model, {"input_ids": ids, "labels": ids}, budget="50%")
    loss = model(input_ids=ids, labels=ids).loss; loss.backward(); opt.step()
    model.solution.save("gpt2.monet")    # next time: MONeTWrapper(model, "gpt2.monet")
"""
from __future__ import annotations

import dataclasses
import sys
import time
import warnings
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from monet.buckets import optimize_buckets
from monet.frontend import GraphBreakError
from monet.held import compiled_peak, hold_budget
from monet.inputs import ExampleInputs
from monet.lm_choice import choose_lm_loss, worth_chunking
from monet.lm_loss import chunked_loss_hint
from monet.options import Options
from monet.pieces import optimize_pieces
from monet.progress import Progress
from monet.terms import MonetWarning, arg, fmt_size
from monet.solver import DEFAULT_GAP
from monet.with_loss import WithLoss, loss_from_name, loss_name  # noqa: F401 (monet.plan's names)

#: where a solved schedule is timed (`Plan.calibrates`), the share of ``time_limit`` the solver
#: gets; the timing (and in full mode a second solve) gets the rest
CALIBRATED_SOLVE_SHARE = 0.5


#: `optimize` returns within about this many times its ``time_limit`` in all: where the capture
#: and the costs leave less than ``time_limit`` of it (a 96-layer GPT-2 captured in 59 s and costed
#: in 32 s at ``time_limit=60``), the solve gets what they leave, less `CALL_MARGIN` of
#: ``time_limit`` for wrapping, but at least `MIN_SOLVE_FRACTION` of ``time_limit``
CALL_LIMIT_FACTOR, CALL_MARGIN, MIN_SOLVE_FRACTION = 2.0, 0.05, 0.25


def solve_limit(time_limit: float, elapsed: float) -> float:
    """Seconds for the solve (and the calibration) of an `optimize` call with ``time_limit``
    seconds whose capture and costs took ``elapsed`` seconds: ``time_limit``, or less where the
    call would pass `CALL_LIMIT_FACTOR` x ``time_limit`` (see there)."""
    left = (CALL_LIMIT_FACTOR - CALL_MARGIN) * time_limit - elapsed
    return max(min(time_limit, left), MIN_SOLVE_FRACTION * time_limit)


# Optimizer state kept per parameter element, in units of the parameter's own bytes (PyTorch's
# implementations: SGD with momentum keeps one buffer, Adam and AdamW two: exp_avg, exp_avg_sq).
OPTIMIZER_STATE = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}


def optimizer_state_bytes(param_bytes: int, optimizer: str | None) -> int:
    """Bytes of optimizer state for ``param_bytes`` bytes of parameters (`OPTIMIZER_STATE`).

    Raises:
        ValueError: an optimizer not in `OPTIMIZER_STATE`.
    """
    if optimizer is None:
        return 0
    key = optimizer.lower()
    if key not in OPTIMIZER_STATE:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZER_STATE)}")
    return OPTIMIZER_STATE[key] * int(param_bytes)


def reserved_parts(param_bytes: int, optimizer: str | None, accumulate_grads: bool,
                   reserved_bytes: int) -> tuple[int, int, int]:
    """The bytes held beside a training step's schedule, by what holds them: (the optimizer's state,
    `optimizer_state_bytes`; the accumulated gradients, ``param_bytes`` when ``accumulate_grads``;
    ``reserved_bytes``).

    Raises:
        ValueError: negative ``reserved_bytes``; an unknown optimizer."""
    if int(reserved_bytes) < 0:
        raise ValueError(f"reserved_bytes must be >= 0, got {reserved_bytes}")
    return (optimizer_state_bytes(param_bytes, optimizer), int(param_bytes) if accumulate_grads else 0,
            int(reserved_bytes))


def zero_gamma_batchnorms(model: nn.Module) -> list[str]:
    """Names of the BatchNorm layers of ``model`` with a weight (gamma) entry equal to 0."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return [name for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.weight is not None and not m.weight.is_meta
            and bool((m.weight.detach() == 0).any())]


def _log(message: str) -> None:
    print(f"monet: {message}", file=sys.stderr, flush=True)


def optimize(model: nn.Module, example_inputs, budget="50%", *, loss_fn=None, target=None,
             time_limit: float = 60.0, options: Options | None = None, **overrides):
    """Solve a memory schedule for ``model`` and return it wrapped: capture, cost, solve, wrap.

    Args:
        model: the ``nn.Module`` to train (not modified; the wrapper holds it).
        example_inputs: one batch as the model is called: a tensor (B, ...), a tuple of positional
            arguments, or a dict of keyword arguments (``{"input_ids": ids, "attention_mask": m,
            "labels": ids}``, ids (B, T) int64).  Only shapes and dtypes are used.  The schedule is
            for this batch size B; smaller batches run it too, larger ones are refused.
        budget: bytes (int), ``"6GB"`` (6 x 2^30 bytes), ``"6GiB"``, ``"6000MiB"``, or a
            percentage (``"50%"``) of what plain PyTorch holds: its simulated peak, plus the
            optimizer's state, accumulated gradients and ``reserved_bytes`` where given; or
            ``"min"`` (None): the smallest budget found whose recomputation is worth it (normal
            mode: the schedules near the smallest feasible one are followed down while one percent
            of plain PyTorch's peak less costs at most `monet.solver.smallest.KNEE_PRICE` points of
            overhead, and the log says what each further MiB would cost; the exact minimum is the one an `InfeasibleBudgetError` names, and
            ``if_infeasible="smallest"`` solves there).  With ``optimizer`` its state is taken out
            of the budget first, so the budget can be the GPU's size.
        time_limit: seconds for everything after the capture and the costing (both logged with
            their times): the solve, the smallest-budget search, the fallback with
            ``if_infeasible="smallest"`` and the calibration share this one deadline
            (`monet.solver.deadline.Deadline`).  Where the schedule is timed (``calibrate``), the
            solver gets `CALIBRATED_SOLVE_SHARE` of it and the timing the rest.  The call as a whole
            returns within about 2 x ``time_limit``: where the capture and the costs take more
            than ``time_limit`` (a model of many layers), the solve gets what is left of that
            (`solve_limit`, said in the log).  A compiled schedule measured over its budget is
            solved again in another ``time_limit`` (`monet.held`).
        loss_fn: optional ``loss_fn(output, target)``: the loss is traced with the model and the
            returned wrapper returns it (call it as ``wrapper(*inputs, target=y)``).  Without it
            the wrapper returns the model's outputs (tensors, tuples, dicts, ``ModelOutput``; a
            transformers model given ``labels`` computes its loss inside).
        target: the example target for ``loss_fn`` (its shape and dtype are traced).
        options: a `monet.options.Options` (default ``Options()``); ``**overrides`` replace its
            fields by name, so ``optimize(model, x, mode="full", cost="analytic")`` is
            ``optimize(model, x, options=Options(mode="full", cost="analytic"))``.  The fields
            (what to solve for, the costs, the solver, the training around the step) are
            documented on `Options`.

    The capture and the costs of the last call on a model are kept (`prepare`): a second call on
    the same model, inputs and cost options solves again without capturing, and one after an
    infeasible budget (``budget="min"``, ``if_infeasible="smallest"``) returns the smallest-budget
    schedule the first call found, in seconds.

    A model Dynamo captures only with graph breaks (a ``print``, ``.item()``, a branch on a value)
    is trained in pieces, as ``torch.compile`` runs it (`monet.pieces.optimize_pieces`): each piece
    that trains solved under the one budget, the code between them run eagerly.

    Returns:
        A `MONeTWrapper`; ``wrapper.solution`` is the `Solution` (``.save(path)`` keeps it).  With
        ``buckets``, a `monet.buckets.BucketedWrapper` (``.solutions``, ``.save(prefix)``).  For a
        model in pieces, a `monet.pieces.PiecewiseModule` (``.solutions``, one per scheduled piece).

    Raises:
        monet.capture.CaptureError: the model cannot be traced, not even in pieces (the message
            names the construct).
        monet.solver.ilp.InfeasibleBudgetError: the budget is below the smallest feasible one,
            which the message names, with the arguments that get it (``budget=<bytes>``,
            ``budget="min"``, ``if_infeasible="smallest"``), and for a language model whose loss
            can be chunked, ``lm_loss="chunked"`` (`monet.lm_loss.chunked_loss_hint`).
        ValueError: a malformed budget, mode, cost source or optimizer; a budget smaller than the
            optimizer's state; ``compile=True`` with a mode other than ``"normal"``.
        TypeError: an override that is no field of `Options` (the message lists them).
    """
    from monet.solver.ilp import InfeasibleBudgetError

    opts = Options.of(options, overrides)
    if opts.buckets is not None:
        return optimize_buckets(model, example_inputs, opts.buckets, budget, optimize=optimize, prepare=prepare,
                                loss_fn=loss_fn, target=target, time_limit=time_limit,
                                options=dataclasses.replace(opts, buckets=None))
    auto = opts.lm_loss == "auto"
    own = dataclasses.replace(opts, lm_loss=None) if auto else opts
    with warnings.catch_warnings(), Progress(opts.progress) as bar:
        if not opts.progress:  # nothing printed: monet's own notes are not shown either (`MonetWarning`)
            warnings.simplefilter("ignore", MonetWarning)
        start = time.perf_counter()
        try:
            plan = prepare(model, example_inputs, loss_fn=loss_fn, target=target, progress=bar, reuse=True,
                           **own.capture_and_costs())
        except GraphBreakError as e:
            bar.log(f"{e}; training it in pieces, as torch.compile runs it")
            module, inputs = _training_module(model, example_inputs, loss_fn, target)
            params = sum(p.untyped_storage().nbytes() for p in module.parameters())
            reserved = sum(reserved_parts(params, opts.optimizer, opts.accumulate_grads, opts.reserved_bytes))
            return optimize_pieces(module, inputs, budget, prepare=prepare, time_limit=time_limit, options=own,
                                   reserved=reserved, bar=bar)
        elapsed = time.perf_counter() - start
        limit = solve_limit(time_limit, elapsed)
        if limit < time_limit:
            plan._log(f"the capture and the costs took {elapsed:.0f} s: the solve gets {limit:.0f} s "
                      f"of its {time_limit:g} s, so that the call returns within about {CALL_LIMIT_FACTOR:g} x "
                      "time_limit")
        try:
            if auto and worth_chunking(plan):
                chunked = dataclasses.replace(own, lm_loss="chunked").capture_and_costs()
                plan, sol = choose_lm_loss(plan, budget, limit, lambda: prepare(
                    model, example_inputs, loss_fn=loss_fn, target=target, progress=bar, **chunked),
                    dict(progress=bar, **own.solving()), bar.log)
            else:
                sol = plan.solve(budget, time_limit=limit, progress=bar, **own.solving())
        except InfeasibleBudgetError:
            _KEPT[:] = [(weakref.ref(model), plan.key, plan)]  # for the call the error recommends
            raise
    return plan.wrap(sol)


@dataclass
class Plan:
    """A captured and costed model, to be solved at any budget and mode (`prepare`'s result).

    Attributes:
        module: the model (or `WithLoss` of it) the graph was captured from.
        inputs: the example inputs (with ``target`` among the keyword arguments for a loss).
        graph: the `OpGraph`; costs: its `CostArrays`; cost_fn: costs of implementation variants.
        eager_peak_bytes: plain PyTorch's simulated peak, bytes (what ``"50%"`` is half of).
        device: the device type the costs are for.
        calibrates: the costs are measured on the CPU: `solve` times each solved schedule and
            predicts it from its measured recomputation (`monet.profiling.calibration`).
    """

    module: nn.Module
    inputs: ExampleInputs
    graph: object
    costs: object
    cost_fn: object
    eager_peak_bytes: int
    device: str
    name: str
    progress: bool = True
    calibrates: bool = False
    keep: nn.Module | None = field(default=None, repr=False)  # dispatch.keep_all, made at the first calibration
    capture_s: float = 0.0  # seconds the capture took: what each trace of a timed executor costs, about
    bar: Progress | None = field(default=None, repr=False)  # the progress of the call under way
    key: tuple = field(default=(), repr=False)  # what the plan is for (`_plan_key`)
    measured: tuple | None = field(default=None, repr=False)  # (solution, its wrapper): the last compiled step measured

    def _log(self, message: str) -> None:
        if self.bar is not None:
            self.bar.log(message)
        elif self.progress:
            _log(message)

    def mode_for(self, mode: str) -> str:
        """``mode`` as this model can run it: without 'multiway' when a BatchNorm has gamma == 0
        (its output-activated backward divides by gamma, `monet.impls.batchnorm`; timm's
        ``zero_init_last``), said in the log.  `solve` applies it; so should a caller that searches
        budgets with ``monet.solver.solve`` directly (costing a variant runs it).

        Raises:
            ValueError: an unknown mode.
        """
        from monet.impls import mode_tokens

        tokens = mode_tokens(mode)
        if self.graph.compiled and mode != "normal":
            raise ValueError(f"mode {mode!r} chooses operator implementations of monet's own, which Inductor does not "
                             "compile: the compiled step (compile=True) is solved in mode 'normal' (keep or recompute)")
        zero = zero_gamma_batchnorms(self.module)
        if "multiway" in tokens and zero:
            mode = "_".join(t for t in ("inplace", "conv", "newnode", "attention") if t in tokens) or "normal"
            self._log(f"{len(zero)} BatchNorm layer(s) have gamma == 0 ({zero[0]} ...; zero-initialised, as timm's "
                      f"zero_init_last does): their output-activated backward cannot recover the input, so the "
                      f"'multiway' implementations are left out: mode {mode}")
        return mode

    def solve(self, budget="50%", *, mode: str = "normal", time_limit: float = 60.0, optimizer: str | None = None,
              solver: str = "CBC", gap: float = DEFAULT_GAP, if_infeasible: str = "raise", accumulate_grads: bool = False,
              reserved_bytes: int = 0, offload_bandwidth: float | None = None, calibrate: bool = True,
              progress: Progress | None = None):
        """The `Solution` at ``budget`` in ``mode`` (arguments as for `optimize`), within
        ``time_limit`` seconds: one `monet.solver.deadline.Deadline` for the solve, the
        smallest-budget search and fallback, and the calibration.  Where the plan `calibrates` and
        ``calibrate`` is true, the solver gets `CALIBRATED_SOLVE_SHARE` of the limit and the solved
        schedule is timed in the rest and predicted from its measured recomputation (in full mode
        solved again with it, the faster kept: `monet.profiling.calibration.calibrated_solve`);
        where the timing would not fit in the rest (`monet.profiling.calibration.timing_fits`),
        it is not timed and the solver gets the whole limit (said in the log).  ``progress``: the
        bar of the call under way, or True/False (None: one of its own, if the plan shows progress)."""
        own = not isinstance(progress, Progress)
        shown = self.progress if progress is None else bool(progress)
        bar = Progress(shown, phases=("solve", "calibration", "measure")) if own else progress
        self.bar = bar
        try:
            return self._solve(budget, mode, time_limit, optimizer, solver, gap, if_infeasible, accumulate_grads,
                               reserved_bytes, offload_bandwidth, calibrate, bar)
        finally:
            self.bar = None
            if own:
                bar.close()

    def _solve(self, budget, mode, time_limit, optimizer, solver, gap, if_infeasible, accumulate_grads,
               reserved_bytes, offload_bandwidth, calibrate, bar: Progress):
        from monet.solver.deadline import Deadline

        mode = self.mode_for(mode)
        if if_infeasible not in ("raise", "smallest"):
            raise ValueError(f"if_infeasible must be 'raise' or 'smallest', got {if_infeasible!r}")
        smallest, budget_bytes, reserved = self.schedule_budget(budget, optimizer, accumulate_grads, reserved_bytes)

        from monet.models import input_info
        from monet.solution import RunInfo

        info = RunInfo(model=self.name, device=self.device, **input_info(self.inputs, None),
                       loss=loss_name(self.module.loss_fn) if isinstance(self.module, WithLoss) else None)
        t0 = time.perf_counter()
        deadline = Deadline(time_limit)
        calibrating = calibrate and self.calibrates
        if calibrating:  # a timing that cannot fit leaves the solver the whole limit
            from monet.profiling.calibration import timing_fits

            calibrating = timing_fits(self.costs, (1 - CALIBRATED_SOLVE_SHARE) * time_limit,
                                      1 if self.keep is not None else 2, self.capture_s, self._log)
        at = "the smallest feasible budget" if smallest else f"{budget_bytes / 2**20:.1f} MiB"
        share = CALIBRATED_SOLVE_SHARE if calibrating else 1.0
        self._log(f"solving at {at} ({mode}, {solver}, {share * time_limit:g} s of the time limit "
                  f"{time_limit:g} s) ...")
        kw = dict(solver=solver, info=info, device=self.device, cost_fn=self.cost_fn,
                  progress=self._log if (self.progress or self.bar is not None and self.bar.enabled) else None,
                  gap=gap, offload_bandwidth=offload_bandwidth)
        with bar.phase("solve"):
            sol = self._solve_or_smallest(budget_bytes, mode, Deadline(share * deadline.left()), if_infeasible, kw)
        if calibrating:
            with bar.phase("calibration"):
                sol = self._calibrated(sol, mode, kw, deadline)
        else:
            bar.skip("calibration")
        if self.graph.compiled and self.inputs.first.device.type == "meta":
            self._log("the compiled step is not measured: the model is on the meta device (its budget is the "
                      "simulation's)")
            bar.skip("measure")
        elif self.graph.compiled:
            with bar.phase("measure"):
                held = None if smallest or sol.meta.budget_bytes != budget_bytes else budget_bytes
                sol = self._held(sol, held, mode, kw, deadline)
        else:
            bar.skip("measure")
        overhead = sol.meta.predicted_overhead()
        total = "" if not reserved else (f" ({fmt_size(sol.meta.predicted_peak_bytes + reserved)} with the "
                                         f"{fmt_size(reserved)} reserved: {sol.meta.predicted_peak_bytes + reserved} bytes)")
        measured = "" if sol.meta.measured_peak_bytes is None else \
            f" (measured compiled: {fmt_size(sol.meta.measured_peak_bytes)})"
        self._log(f"solved in {time.perf_counter() - t0:.1f} s: {sol.meta.status}, predicted peak "
                  f"{fmt_size(sol.meta.predicted_peak_bytes)}{measured}{total}, {sol.schedule.recompute_count()} "
                  "recomputations"
                  + ("" if overhead is None else f", predicted overhead {100 * overhead:+.1f} %"))
        return sol

    def schedule_budget(self, budget, optimizer, accumulate_grads: bool, reserved_bytes: int):
        """(smallest: ``budget`` is ``"min"``/None, the schedule's budget in bytes (None for the
        smallest), the bytes reserved beside it: optimizer state, accumulated gradients and
        ``reserved_bytes``); a percentage is of plain PyTorch's simulated peak plus the reserved bytes.

        Raises:
            ValueError: negative ``reserved_bytes``, or reserved bytes that leave the schedule nothing."""
        from monet.solver.solve import parse_budget

        smallest = budget is None or (isinstance(budget, str) and budget.strip().lower() == "min")
        state, grads, _ = parts = reserved_parts(self.graph.param_bytes, optimizer, accumulate_grads, reserved_bytes)
        reserved = sum(parts)
        # a percentage is of what plain PyTorch holds: its simulated peak plus what is reserved
        budget_bytes = None if smallest else parse_budget(budget, self.eager_peak_bytes + reserved)
        if reserved:
            what = " and ".join(w for w, b in ((f"the {optimizer} state", state), ("the accumulated gradients", grads),
                                              ("the reserved bytes", int(reserved_bytes))) if b)
            if smallest:
                self._log(f"{what} take {fmt_size(reserved)}: the budget is the smallest schedule's plus that")
            elif reserved >= budget_bytes:
                raise ValueError(
                    f"{what} ({reserved} bytes, {fmt_size(reserved)}) do not fit the budget ({budget_bytes} bytes, "
                    f"{fmt_size(budget_bytes)}): a budget must hold them and the schedule's peak; "
                    + arg(f'budget="min" with optimizer={optimizer!r} gives the smallest schedule and says its total, '
                          f"or give more than {reserved} bytes",
                          f"--min-budget gives the smallest schedule, or give more than {reserved} bytes"))
            else:
                self._log(f"{what} take {fmt_size(reserved)}: the schedule gets "
                          f"{fmt_size(budget_bytes - reserved)} of the {fmt_size(budget_bytes)} budget")
                budget_bytes -= reserved
        return smallest, budget_bytes, reserved

    def _solve_or_smallest(self, budget_bytes, mode: str, solving, if_infeasible: str, kw: dict):
        """The schedule at ``budget_bytes`` within ``solving``; with ``if_infeasible="smallest"``, at
        the smallest feasible budget where that one is infeasible.

        Raises:
            InfeasibleBudgetError: infeasible and ``if_infeasible="raise"`` (with the chunked-loss
                hint where a language model's loss could be replaced)."""
        from monet.solver.ilp import InfeasibleBudgetError
        from monet.solver.solve import solve

        try:
            return solve(self.graph, self.costs, budget_bytes, mode, deadline=solving, **kw)
        except InfeasibleBudgetError as e:
            if if_infeasible != "smallest" or e.min_budget_bytes is None:
                # a language model's loss the chunked loss can replace: say so (a graph
                # captured with lm_loss= holds no such loss any more)
                shortfall = (e.min_budget_bytes or 0) - e.budget_bytes
                if self.graph.exported is not None:
                    e.args = (str(e) + chunked_loss_hint(self.graph.exported[1], shortfall),)
                raise
            self._log(f"{e}; solving at the smallest feasible budget found, {e.min_budget_bytes / 2**20:.1f} MiB")
            return solve(self.graph, self.costs, None, mode, deadline=solving, knee_min=False,
                         **kw)  # the search kept: at once

    def _held(self, sol, budget: int | None, mode: str, kw: dict, deadline):
        """``sol`` held to ``budget`` bytes (None: the smallest budget) by measuring its compiled
        step (`monet.held.hold_budget`): one training step on the plan's module, left as it was
        (`monet.profiling.dispatch.restored`), pinned to its stages or solved again where over,
        each solve in the call's time limit again (below the smallest feasible budget, the smallest
        schedule); the last wrapper measured is kept
        (`measured`), so `wrap` returns it compiled."""
        from monet.solver.deadline import Deadline

        def measure(s):
            wrapper = self.wrap(s)
            peak = compiled_peak(wrapper, self.module, self.inputs, self.graph.autocast)
            self.measured = (s, wrapper)
            return peak

        def resolve(b: int):  # in the call's time limit again: the first solve spent it
            return self._solve_or_smallest(b, mode, Deadline(max(deadline.left(), deadline.limit_s)), "smallest", kw)

        return hold_budget(sol, budget, measure, resolve, self._log)

    def _calibrated(self, sol, mode: str, kw: dict, deadline):
        from monet.profiling.calibration import calibrated_solve
        from monet.profiling.dispatch import keep_all
        from monet.solver.deadline import Deadline
        from monet.solver.solve import solve

        def make_keep():
            self.keep = keep_all(self.module, self.inputs, self.graph, self.costs)
            return self.keep

        return calibrated_solve(self.module, self.inputs, self.graph, self.costs, sol,
                                lambda costs, again=None: solve(self.graph, costs, sol.meta.budget_bytes, mode,
                                                                deadline=again or Deadline(0.0), **kw),
                                keep=self.keep, make_keep=make_keep, device=self.device, cost_fn=self.cost_fn,
                                log=self._log, deadline=deadline, trace_s=self.capture_s)

    def wrap(self, solution, model: nn.Module | None = None):
        """`MONeTWrapper` of ``model`` (default: the captured module; with a loss, pass
        ``WithLoss(model, loss_fn)``) with ``solution``."""
        from monet.wrapper import MONeTWrapper

        if model is None and self.measured is not None and self.measured[0] is solution:
            return self.measured[1]  # compiled and measured by `solve`
        wrapper = MONeTWrapper(self.module if model is None else model, solution)
        if model is None or model is self.module:
            wrapper.offer_export(self.graph)  # the first training call traces the capture's export
        return wrapper


#: outputs' gradients (bytes) from this fraction of plain PyTorch's simulated peak up make
#: `loss_outside_note` speak: a loss computed from them outside the graph is outside the budget
LOSS_OUTSIDE_FRACTION = 0.02
#: what `prepare` (and so `optimize`) suggests in its warning
LOSS_OUTSIDE_REMEDY = ("pass loss_fn= and target= to trace the loss with the model, or take its bytes out of "
                       "the budget with reserved_bytes=")


def loss_outside_note(graph, eager_peak_bytes: int, remedy: str = LOSS_OUTSIDE_REMEDY) -> str | None:
    """A note when ``graph``'s outputs hold no scalar loss and their gradients
    (``graph.tangent_bytes``) are at least `LOSS_OUTSIDE_FRACTION` of ``eager_peak_bytes``, else
    None.  The budget covers the captured graph, its outputs and their gradients, not what the
    caller computes from the outputs, and a language model's loss on its logits takes several
    times their bytes: GPT-2 small at width 128 with 4096 tokens, batch 2 x 128 (4 MiB of logits),
    measured 10 MiB over its schedule's 34 MiB budget with the mean square of the logits computed
    outside, and under it with the cross-entropy traced in.  ``remedy``: the sentence that says what to do."""
    if graph.loss_output or graph.tangent_bytes < LOSS_OUTSIDE_FRACTION * eager_peak_bytes:
        return None
    return (f"the model's outputs ({graph.tangent_bytes / 2**20:.1f} MiB, "
            f"{graph.tangent_bytes / eager_peak_bytes:.0%} of plain PyTorch's simulated peak) hold no scalar "
            "loss: the loss computed from them runs outside the schedule and its temporaries (often 2-3x the "
            f"outputs' bytes) are not in the budget; {remedy}")


#: the plan of the last `optimize` call that found its budget infeasible, with its model (weakly)
#: and the key it was made for (`_plan_key`); the next `optimize` call takes or drops it
_KEPT: list = []


def _plan_key(model: nn.Module, inputs: ExampleInputs, loss_fn, options: tuple) -> tuple:
    """What a plan is specific to: the inputs' structure, shapes, dtypes and devices and their
    non-tensor values, the model's parameters and buffers (names, shapes, dtypes, devices: its
    structure, not its values), its training mode, the loss function and the cost options."""
    from monet.inputs import call_key

    tensors = [(n, tuple(t.shape), t.dtype, t.device) for n, t in
               list(model.named_parameters()) + list(model.named_buffers())]
    return (call_key(inputs, None), tuple(tensors), model.training, id(loss_fn), options)


def forget_plans() -> None:
    """Drop the plan an infeasible `optimize` call kept (it holds its model)."""
    _KEPT.clear()


def _kept_plan(model: nn.Module, key: tuple):
    """The plan `_KEPT` holds for ``model`` and ``key``, else None; the slot is emptied either way."""
    kept = _KEPT.pop() if _KEPT else None
    if kept is not None and kept[0]() is model and kept[1] == key:
        return kept[2]
    return None


def _training_module(model: nn.Module, example_inputs, loss_fn, target):
    """(the module trained: ``model``, or ``WithLoss(model, loss_fn)`` called with ``target=``; its
    example inputs as that module is called in training).

    Raises:
        ValueError: ``loss_fn`` without ``target``."""
    from monet.frontend import training_inputs

    inputs = ExampleInputs.of(example_inputs)
    module = model
    if loss_fn is not None:
        if target is None:
            raise ValueError("loss_fn needs an example target (target=...) to trace the loss with")
        module = WithLoss(model, loss_fn)
        inputs = ExampleInputs(inputs.args, {**inputs.kwargs, "target": target})
    return module, training_inputs(module, inputs)


def prepare(model: nn.Module, example_inputs, *, loss_fn=None, target=None, cost: str = "hybrid",
            device: str | None = None, gpu_spec: str | None = None, autocast_dtype: torch.dtype | None = None,
            cache_dir=None, progress: bool | Progress = True, reuse: bool = False, lm_loss=None,
            compile: bool = False) -> Plan:
    """Capture and cost ``model`` once (arguments as for `optimize`); solve the `Plan` at any budget.

    ``reuse``: take the plan the last `optimize` call kept when it found its budget infeasible,
    if it is for ``model`` with the same inputs (structure, shapes, dtypes), the same model
    structure (its parameters' and buffers' names, shapes and dtypes), loss function and cost
    options: no capture and no costing again (said in the log), and the smallest-budget search it
    ran comes with it (`monet.solver.smallest`).  ``progress``: True/False, or the
    `monet.progress.Progress` of the call under way.

    Raises:
        monet.capture.CaptureError: the model cannot be traced.
        ValueError: a malformed cost source, or ``loss_fn`` without ``target``.
    """
    from monet.capture import capture
    from monet.profiling.shallow import describe_costing
    from monet.profiling.sources import solver_costs, variant_cost_fn
    from monet.solver.solve import eager_peak
    from monet.stack import forget_copy

    if lm_loss == "auto":
        raise ValueError('lm_loss="auto" is monet.optimize\'s choice between two captures: prepare takes None, '
                         '"chunked" or a number of token rows per chunk')
    own = not isinstance(progress, Progress)
    bar = Progress(bool(progress), phases=("capture", "costs")) if own else progress
    module, inputs = _training_module(model, example_inputs, loss_fn, target)
    device = device or inputs.first.device.type
    key = _plan_key(model, inputs, loss_fn, (cost, device, gpu_spec, autocast_dtype, str(cache_dir), lm_loss,
                                             bool(compile)))
    plan = _kept_plan(model, key) if reuse else None
    if plan is not None:
        plan.progress = bar.enabled
        bar.log(f"the capture, costs and smallest-budget search of the last call on this {plan.name} are reused "
                "(it found its budget infeasible; same inputs, structure and options)")
        bar.skip("capture")
        bar.skip("costs")
        if own:
            bar.close()
        return plan
    name = type(model).__name__
    try:
        with bar.phase("capture"):
            t0 = time.perf_counter()
            bar.log(f"capturing {name} on {inputs.describe()} ...")
            graph = capture(module, inputs, autocast_dtype=autocast_dtype, lm_loss=lm_loss, log=bar.log,
                            keep_copy=cost != "analytic").for_compile(compile)
            capture_s = time.perf_counter() - t0
            bar.log(f"captured in {capture_s:.1f} s: {graph.describe()}")
        with bar.phase("costs"):
            t0 = time.perf_counter()
            table, costs = solver_costs(cost, module, inputs, graph, device, gpu_spec, cache_dir)
            # the compiled step is solved in normal mode: no implementation variants to cost
            cost_fn = None if compile else variant_cost_fn(cost, module, inputs, graph, table, device, gpu_spec,
                                                           cache_dir)
            eager = eager_peak(graph, costs)
            bar.log(f"costed ({cost}) in {time.perf_counter() - t0:.1f} s ({describe_costing(module, graph)}): "
                    f"plain PyTorch's simulated peak {eager / 2**20:.1f} MiB, operators "
                    f"{1e3 * costs.total_time:.1f} ms per iteration")
    finally:
        forget_copy()  # the costs measured on it, or never will
        if own:
            bar.close()
    note = loss_outside_note(graph, eager)
    if note:
        warnings.warn(note, MonetWarning, stacklevel=2)
    from monet.profiling import calibration

    return Plan(module, inputs, graph, costs, cost_fn, eager, device.split(":")[0], name, bar.enabled,
                calibrates=calibration.applies(cost, device) and not compile, capture_s=capture_s, key=key)


__all__ = ["reserved_parts", "CALIBRATED_SOLVE_SHARE", "CALL_LIMIT_FACTOR", "solve_limit", "forget_plans", "loss_from_name", "loss_name", "LOSS_OUTSIDE_FRACTION", "LOSS_OUTSIDE_REMEDY", "loss_outside_note", "optimize", "prepare", "Plan", "optimizer_state_bytes", "WithLoss", "OPTIMIZER_STATE"]
