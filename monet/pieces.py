"""A model Dynamo captures in pieces (graph breaks): each piece scheduled, the code between run
eagerly, all under one budget.

``torch.compile`` trains a model whose forward prints, calls ``.item()``, branches on a value or
sets ``requires_grad`` by breaking its graph there: Dynamo traces the stretches of the forward it
can into graphs (the pieces), hands each to its backend, and runs the Python between them itself.
`optimize_pieces` uses Dynamo the same way: ``torch.compile(module, backend=Pieces(module))``.  The
backend records each piece (`Piece`) and returns a slot that runs it: plainly during the one forward
that finds the pieces (`find`), and with its `MONeTWrapper` once the pieces are solved.  Autograd
joins the pieces' backward passes through the eager code, as it does for ``torch.compile``.

Each piece with an output that needs a gradient becomes a module of its own (`PieceModule`: the
graph, with the model's parameters and buffers it reads registered by reference) that monet
captures, costs and solves as any model.  The memory of the whole step (docs/design.md, Note
[Pieces under one budget]): while piece k runs, the rest of the step holds the parameters and
buffers piece k does not read, the model's inputs it does not take, what the earlier pieces keep
for their backward (their schedules' saved bytes) and, in its backward, the gradients of the later
pieces' parameters (`held_outside`).  Each piece offers a few schedules, and
`monet.solver.split.split` picks one per piece, the fastest set whose peaks fit the budget beside
what is held then (`solve_pieces`).
"""
from __future__ import annotations

import dataclasses
import functools
import re
import time
import warnings

import torch
import torch.fx as fx
import torch.nn as nn

from monet.inputs import ExampleInputs
from monet.terms import MonetWarning


class PieceModule(nn.Module):
    """One piece as a module: ``forward(*inputs)`` runs the Dynamo graph ``graph_module`` with the
    model's parameters and buffers (registered here by reference, so the gradients and the
    batch-norm statistics are the model's) in the places Dynamo passed them.

    Args:
        graph_module: the graph Dynamo handed to the backend; it takes every tensor it reads as an
            argument (parameters and buffers too) and returns a tuple.
        slots: per argument of ``graph_module``: ``("param", name)``, ``("buffer", name)`` (the
            model's names) or ``("input", None)``: the next of ``forward``'s inputs.
        tensors: the model's parameters and buffers by name.
    """

    def __init__(self, graph_module: fx.GraphModule, slots: list[tuple[str, str | None]], tensors: dict):
        super().__init__()
        self.graph_module = graph_module
        self._slots: list[tuple[str, object]] = []
        used: set[str] = set()
        inputs = 0
        for kind, name in slots:
            if kind == "input":
                self._slots.append(("input", inputs))
                inputs += 1
                continue
            attr = re.sub(r"\W", "_", name)
            while attr in used:
                attr += "_"
            used.add(attr)
            (self.register_parameter if kind == "param" else self.register_buffer)(attr, tensors[name])
            self._slots.append((kind, attr))
        self.num_inputs = inputs

    def forward(self, *inputs):
        args = [inputs[key] if kind == "input" else getattr(self, key) for kind, key in self._slots]
        return self.graph_module(*args)


@dataclasses.dataclass
class Piece:
    """One graph Dynamo traced: ``index`` in the order compiled, its `PieceModule`, its example
    inputs from the forward that found it (detached copies, ``requires_grad`` as passed), whether an
    output needs a gradient (``trainable``: only such a piece is scheduled), ``where`` (file:line of
    its first and last operation) and the callable that runs it once solved (``runner``)."""

    index: int
    module: PieceModule
    slots: list
    where: str
    example: tuple | None = None
    trainable: bool = False
    output_bytes: int = 0
    runner: object = None
    found_late: bool = False

    def reads(self) -> list[str]:
        """Names of the model's parameters and buffers this piece reads."""
        return [name for kind, name in self.slots if kind != "input"]


def _where(gm: fx.GraphModule) -> str:
    """``file:line`` of the graph's first and last operation with a stack trace (Dynamo's meta)."""
    lines = []
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace") or ""
        found = re.findall(r'File "([^"]+)", line (\d+)', trace)
        if found:
            lines.append(f"{found[-1][0].rsplit('/', 1)[-1]}:{found[-1][1]}")
    if not lines:
        return "?"
    return lines[0] if lines[0] == lines[-1] else f"{lines[0]} to {lines[-1]}"


def _leaves(value) -> list:
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


class Pieces:
    """The backend: records each graph Dynamo hands it as a `Piece` and returns a slot that runs
    it (`run`).  ``finding`` is true during the forward that finds the pieces; a graph compiled
    after it (a branch the example batch did not take, the eval mode) runs plainly, outside the
    budget, with a `MonetWarning` where it trains."""

    def __init__(self, owner: nn.Module):
        self.tensors = dict(owner.named_parameters(remove_duplicate=False))
        self.tensors.update(owner.named_buffers(remove_duplicate=False))
        self.names: dict[int, tuple[str, str]] = {}
        for name, t in owner.named_buffers(remove_duplicate=False):
            self.names.setdefault(id(t), ("buffer", name))
        for name, t in owner.named_parameters(remove_duplicate=False):
            self.names[id(t)] = ("param", name)
        self.pieces: list[Piece] = []
        self.finding = True

    def __call__(self, gm: fx.GraphModule, example_inputs):
        slots = [self.names.get(id(t), ("input", None)) for t in example_inputs]
        piece = Piece(len(self.pieces), PieceModule(gm, slots, self.tensors), slots, _where(gm),
                      found_late=not self.finding)
        self.pieces.append(piece)
        return functools.partial(self.run, piece)

    def run(self, piece: Piece, *args):
        if piece.runner is not None:
            return piece.runner(*[a for a, (kind, _) in zip(args, piece.slots) if kind == "input"])
        out = piece.module.graph_module(*args)
        if self.finding and piece.example is None:
            piece.example = tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                                  else a for a, (kind, _) in zip(args, piece.slots) if kind == "input")
            outs = _leaves(out)
            piece.trainable = any(o.requires_grad for o in outs)
            piece.output_bytes = sum(o.untyped_storage().nbytes() for o in outs)
        elif piece.found_late and torch.is_grad_enabled() and _leaves(out) and any(o.requires_grad for o in _leaves(out)):
            warnings.warn(f"monet: a graph Dynamo traced after the pieces were solved ({piece.where}: a branch "
                          "the example batch did not take) runs plainly, its memory outside the budget; solve with an "
                          "example batch that takes it", MonetWarning, stacklevel=2)
            piece.found_late = False  # said once
        return out


def graph_break_reasons() -> dict[str, int]:
    """Dynamo's graph-break reasons so far (the first line of each and its explanation) and how often
    each happened."""
    from monet.compat import graph_break_counts

    reasons: dict[str, int] = {}
    for text, count in graph_break_counts().items():
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()] or ["?"]
        line = lines[0] + "".join(f": {x.removeprefix('Explanation:').strip()}" for x in lines[1:2]
                                  if x.startswith("Explanation:"))
        reasons[line] = reasons.get(line, 0) + count
    return reasons


def find(module: nn.Module, inputs: ExampleInputs):
    """Run one forward of ``module`` (training mode, gradients on) through ``torch.compile`` with a
    `Pieces` backend, the module left as it was (`monet.profiling.dispatch.restored`: buffers,
    gradients, random state).  Returns ``(compiled, backend, reasons)``: the compiled module (the
    slots run it with the schedules once set), the backend with its pieces in order, and the
    graph breaks' reasons (`graph_break_reasons`, this forward's only)."""
    from monet.profiling.dispatch import restored

    before = graph_break_reasons()
    backend = Pieces(module)
    compiled = torch.compile(module, backend=backend, dynamic=False)
    was = module.training
    module.train()
    try:
        with restored(module, inputs), torch.enable_grad():
            compiled(*inputs.args, **inputs.kwargs)
    finally:
        module.train(was)
        backend.finding = False
    reasons = {k: v - before.get(k, 0) for k, v in graph_break_reasons().items() if v > before.get(k, 0)}
    return compiled, backend, reasons


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += t.untyped_storage().nbytes()
    return total


def held_outside(pieces: list[Piece], k: int, tensors: dict, inputs: ExampleInputs, kept: list[int]) -> int:
    """Bytes the rest of the step holds while trainable piece ``pieces[k]`` runs (Note [Pieces under
    one budget]): the parameters and buffers it does not read, the model's input tensors it does not
    take, ``kept[j]`` (what piece j < k keeps for its backward, bytes) and the gradients of the
    parameters only the later pieces read (they exist during its backward)."""
    own = set(pieces[k].reads())
    mine = {id(t) for t in pieces[k].example or ()}
    later = {n for p in pieces[k + 1:] for n in p.reads()} - own - {n for p in pieces[:k] for n in p.reads()}
    other = [t for name, t in tensors.items() if name not in own]
    grads = [t for name, t in tensors.items() if name in later and t.requires_grad]
    model_inputs = [t for t in inputs.leaves() if isinstance(t, torch.Tensor) and id(t) not in mine]
    return _bytes(other) + _bytes(grads) + _bytes(model_inputs) + sum(kept[:k])


class PiecewiseModule(nn.Module):
    """The model trained piece by piece: called as the model (``target=`` too, with a loss), it runs
    the compiled module whose pieces run their schedules and whose code between them runs eagerly.
    Its parameters and ``state_dict`` keys are the model's.

    Attributes:
        module: the model (or its `WithLoss`).
        pieces: the pieces in the order Dynamo compiled them.
        solutions: the `Solution` of each scheduled piece, in that order.
        budget_bytes: the one budget they share; predicted_peak_bytes: the step's predicted peak;
        eager_peak_bytes: plain PyTorch's, composed from the pieces' (`optimize_pieces`).
    """

    def __init__(self, module: nn.Module, compiled, backend: Pieces, solutions: list, budget_bytes: int,
                 predicted_peak_bytes: int, eager_peak_bytes: int):
        super().__init__()
        self.module = module
        self._compiled = compiled
        self._backend = backend
        self.solutions = solutions
        self.budget_bytes = budget_bytes
        self.predicted_peak_bytes = predicted_peak_bytes
        self.eager_peak_bytes = eager_peak_bytes

    @property
    def pieces(self) -> list[Piece]:
        return self._backend.pieces

    def forward(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    # the model's keys, as `MONeTWrapper`'s: checkpoints load into the model as it is
    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


def _kept_bytes(plan, schedule) -> int:
    """Bytes ``schedule``'s forward hands to its backward (`monet.simulate.SimResult.saved_bytes`)."""
    from monet.simulate import schedule_peak

    return schedule_peak(plan.graph, plan.costs, schedule).saved_bytes


def describe_breaks(backend: Pieces, reasons: dict[str, int]) -> list[str]:
    """Log lines: each graph break's reason, then each piece, where it is and whether it is scheduled."""
    lines = [f"Dynamo broke the graph ({n} x): {why}" for why, n in reasons.items()]
    for p in backend.pieces:
        what = "scheduled" if p.trainable else "run plainly (no output needs a gradient)"
        lines.append(f"piece {p.index + 1} of {len(backend.pieces)} ({p.where}): {what}")
    return lines


#: schedules each piece offers the split (`monet.solver.split`): at its smallest feasible budget, at
#: the most it can have beside the rest, and evenly between
LEVELS = 4


def _options(plan, least: int, most: int, share: float, solving: dict) -> list:
    """``plan``'s schedules at `LEVELS` budgets from ``least`` to ``most`` bytes, ``share`` seconds
    each, as `monet.solver.split.Option` objects (``ref``: the `Solution`); a budget that fits none is
    left out."""
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.split import Option

    budgets = sorted({int(least + (most - least) * i / (LEVELS - 1)) for i in range(LEVELS)}) if most > least \
        else [least] if most == least else []
    out = []
    for b in budgets:
        try:
            sol = plan.solve(b, time_limit=share, **solving)
        except InfeasibleBudgetError:
            continue
        out.append(Option(sol.meta.predicted_peak_bytes, _kept_bytes(plan, sol.schedule), sol.meta.objective_s, sol))
    return out


def _overhead(sol) -> str:
    overhead = sol.meta.predicted_overhead()
    return "-" if overhead is None else f"{100 * overhead:+.1f} %"


def _piece_infeasible(piece: Piece, budget_bytes: int, held: int, least: int, mode: str):
    """The `InfeasibleBudgetError` of a piece that fits no schedule beside the ``held`` bytes."""
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.terms import fmt_size

    need = held + least
    error = InfeasibleBudgetError(budget_bytes, need, mode, exact=False)
    error.args = (f"no schedule fits a budget of {budget_bytes} bytes ({fmt_size(budget_bytes)}) in mode {mode}: "
                  f"piece {piece.index + 1} of the model ({piece.where}) needs {fmt_size(least)} at its smallest "
                  f"beside the {fmt_size(held)} the rest of the step holds then (parameters it does not read, what "
                  f"the earlier pieces keep at their smallest): give budget={need} or more",)
    return error


def solve_pieces(trainable: list[Piece], plans: list, fixed: list[int], budget_bytes: int, time_limit: float, options,
                 bar) -> tuple[list, int]:
    """Solve the trainable pieces under ``budget_bytes`` together (Note [Pieces under one budget]):
    each offers `LEVELS` schedules (`_options`, uncalibrated, ``time_limit`` seconds shared among
    all the solves), `monet.solver.split.split` picks one per piece, and each piece's ``runner``
    becomes its wrapper.  ``fixed[k]``: the bytes held beside piece k that no schedule changes
    (`held_outside` with nothing kept, and the reserved bytes).  Returns (the solutions in
    the pieces' order, the predicted peak of the step in bytes).

    Raises:
        monet.solver.ilp.InfeasibleBudgetError: a piece fits no schedule beside what is held then.
    """
    from monet.solver.smallest import min_budget
    from monet.solver.split import split
    from monet.terms import fmt_size

    share = max(time_limit / (LEVELS * len(plans)), 1.0)
    solving = {**options.solving(), "if_infeasible": "raise", "calibrate": False, "reserved_bytes": 0,
               "optimizer": None, "accumulate_grads": False}
    least = [min_budget(plan.graph, plan.costs, plan.mode_for(options.mode), options.solver, share, plan.device,
                        plan.cost_fn)[0] for plan in plans]
    offered = []
    for k, plan in enumerate(plans):
        plan.progress = False  # one line per piece below, not one per solve
        offered.append(_options(plan, least[k], min(plan.eager_peak_bytes, budget_bytes - fixed[k]), share, solving))
        if offered[-1]:
            bar.log(f"piece {trainable[k].index + 1} ({trainable[k].where}): {len(offered[-1])} "
                    f"schedule{'s' if len(offered[-1]) > 1 else ''}, predicted "
                    f"overhead {', '.join(_overhead(o.ref) for o in offered[-1])}")
    chosen = split(fixed, offered, budget_bytes)
    if chosen.failed is not None:
        k = chosen.failed
        held = fixed[k] + sum(min((o.kept for o in opts), default=0) for opts in offered[:k])
        raise _piece_infeasible(trainable[k], budget_bytes, held, least[k], options.mode)
    solutions = [offered[k][i].ref for k, i in enumerate(chosen.picks)]
    for piece, plan, sol in zip(trainable, plans, solutions):
        piece.runner = plan.wrap(sol)
        bar.log(f"piece {piece.index + 1}: predicted peak {fmt_size(sol.meta.predicted_peak_bytes)}, overhead "
                f"{_overhead(sol)}")
    return solutions, chosen.peak


def optimize_pieces(module: nn.Module, inputs: ExampleInputs, budget, *, prepare, time_limit: float, options,
                    reserved: int, bar) -> PiecewiseModule:
    """`monet.optimize` for a model Dynamo traces in pieces: find the pieces (`find`), capture and
    cost each that trains (``prepare``: `monet.plan.prepare`, passed in by `monet.optimize`), solve
    them under one budget (`solve_pieces`), and run the compiled module with their schedules.

    Args:
        module: the module trained (the model, or its `WithLoss`); not modified.
        inputs: its example inputs as it is called; their values run one forward (a branch on a
            value takes the example batch's way).
        budget: bytes, ``"6GB"`` or a percentage of plain PyTorch's peak of the whole step, composed
            from the pieces' simulated peaks and what the rest of the step holds beside each.
        time_limit: seconds for the smallest-budget searches and the solves, shared among the
            pieces that train.
        reserved: bytes held beside the whole step (the optimizer's state, accumulated gradients,
            ``reserved_bytes``: `monet.plan.Plan.solve`'s), taken out of the budget.
        options: the `monet.options.Options` of the call; ``bar``: its `monet.progress.Progress`.

    Returns:
        A `PiecewiseModule`.

    Raises:
        ValueError: no piece has an output that needs a gradient; ``budget="min"``.
        monet.solver.ilp.InfeasibleBudgetError: a piece does not fit beside what the rest holds;
            the message names the piece and the budget it needed.
    """
    from monet.solver.budget import parse_budget
    from monet.solver.finish import eager_simulation
    from monet.terms import fmt_size

    if budget is None or (isinstance(budget, str) and budget.strip().lower() == "min"):
        raise ValueError('budget="min" is not offered for a model captured in pieces: give bytes or a percentage')
    t0 = time.perf_counter()
    compiled, backend, reasons = find(module, inputs)
    for line in describe_breaks(backend, reasons):
        bar.log(line)
    bar.log(f"found {len(backend.pieces)} pieces in {time.perf_counter() - t0:.1f} s")
    trainable = [p for p in backend.pieces if p.trainable]
    if not trainable:
        raise ValueError("no output of the model's pieces needs a gradient: nothing to train")
    with warnings.catch_warnings():  # a piece's outputs are the next code's inputs, not the step's loss
        warnings.filterwarnings("ignore", message=".*hold no scalar loss", category=MonetWarning)
        plans = [prepare(p.module, ExampleInputs(p.example, {}), progress=bar,
                         **{**options.capture_and_costs(), "lm_loss": None}) for p in trainable]
    plain = [eager_simulation(plan.graph, plan.costs).saved_bytes for plan in plans]
    eager = max(held_outside(trainable, k, backend.tensors, inputs, plain) + plan.eager_peak_bytes
                for k, plan in enumerate(plans)) + reserved
    budget_bytes = parse_budget(budget, eager)
    bar.log(f"plain PyTorch's peak of the step, composed from its {len(plans)} scheduled pieces: {fmt_size(eager)}; "
            f"budget {fmt_size(budget_bytes)}")
    fixed = [held_outside(trainable, k, backend.tensors, inputs, [0] * len(plans)) + reserved for k in range(len(plans))]
    solutions, peak = solve_pieces(trainable, plans, fixed, budget_bytes, time_limit, options, bar)
    bar.log(f"predicted peak of the step {fmt_size(peak)} (budget {fmt_size(budget_bytes)})")
    return PiecewiseModule(module, compiled, backend, solutions, budget_bytes, peak, eager)

__all__ = ["Piece", "PieceModule", "Pieces", "PiecewiseModule", "describe_breaks", "find", "graph_break_reasons", "held_outside",
           "optimize_pieces", "solve_pieces"]
