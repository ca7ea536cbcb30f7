"""A cvxpy MILP as the arrays a MIP solver reads, and what one solve of it gave.

The CBC back-ends (`monet.solver.cbc`: CBC's C interface from cylp, in a child process;
`monet.solver.pulp_cbc`: PuLP's bundled CBC program, several threads) share this module: cvxpy
builds the model and reduces it to standard form (``problem.get_problem_data``, `standard_form`);
a back-end solves it; its answer is handed back to cvxpy (``problem.unpack_results``, `finish`), so
the problem's variables hold the values as after ``problem.solve``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import cvxpy as cp
import cvxpy.settings as s
import numpy as np
import scipy.sparse as sp
from cvxpy.reductions.solvers.conic_solvers.conic_solver import dims_to_solver_dict


@dataclass
class MilpOutcome:
    """What one MIP solve gave.  Objective and bound in the model's units (seconds here), without
    cvxpy's constant offset unless ``offset`` is added; ``history`` is (wall s, incumbent, bound);
    ``detail`` says why a solve ended without an answer (a crash, the hard deadline)."""

    status: str  # "optimal" | "gap" (stopped at the gap target) | "time_limit" | "infeasible" | "no_integer"
    objective: float | None
    bound: float | None
    solve_time_s: float
    history: list[tuple[float, float | None, float | None]] = field(default_factory=list)
    detail: str = ""


@dataclass
class StandardForm:
    """min c x  s.t.  row_lb <= A x <= row_ub,  col_lb <= x <= col_ub,  x[ints] integer.

    ``A`` is (m, n) CSC; rows ``0..n_eq-1`` are equalities (row_lb = row_ub), the others have
    row_lb -inf.  ``offset`` is cvxpy's constant (not in c).  ``start_idx``/``start_val`` are the
    columns and values of a MIP start (None: none).  ``chain``/``inverse`` map an answer back
    to the cvxpy problem (`finish`)."""

    A: sp.csc_matrix
    c: np.ndarray
    row_lb: np.ndarray
    row_ub: np.ndarray
    col_lb: np.ndarray
    col_ub: np.ndarray
    ints: np.ndarray
    n_eq: int
    offset: float
    start_idx: np.ndarray | None
    start_val: np.ndarray | None
    chain: object
    inverse: object

    @property
    def n(self) -> int:
        return self.A.shape[1]

    @property
    def m(self) -> int:
        return self.A.shape[0]


def standard_form(problem: cp.Problem, start: dict | None = None) -> StandardForm:
    """``problem`` (a minimisation with linear constraints and boolean or integer variables) in
    the arrays a MIP solver reads.  ``start``: {cvxpy Variable: values} of a MIP start; variables
    not in the problem are skipped, those left out are for the solver to compute."""
    data, chain, inverse = problem.get_problem_data(cp.CBC)
    A = data[s.A].tocsc()
    b = np.asarray(data[s.B], dtype=float)
    c = np.asarray(data[s.C], dtype=float)
    n_eq = dims_to_solver_dict(data[s.DIMS])[s.EQ_DIM]
    n, m = len(c), A.shape[0]
    row_lb = np.concatenate([b[:n_eq], np.full(m - n_eq, -np.inf)])
    col_lb = np.full(n, -np.inf) if data.get(s.LOWER_BOUNDS) is None else np.array(data[s.LOWER_BOUNDS], float)
    col_ub = np.full(n, np.inf) if data.get(s.UPPER_BOUNDS) is None else np.array(data[s.UPPER_BOUNDS], float)
    ints = np.concatenate([np.asarray(data[s.BOOL_IDX], int), np.asarray(data[s.INT_IDX], int)])
    bools = np.asarray(data[s.BOOL_IDX], int)
    col_lb[bools] = np.maximum(col_lb[bools], 0)
    col_ub[bools] = np.minimum(col_ub[bools], 1)
    offset = float(np.ravel(data.get(s.OFFSET, 0.0))[0]) if data.get(s.OFFSET) is not None else 0.0
    start_idx = start_val = None
    if start:
        cols = data[s.PARAM_PROB].var_id_to_col
        idx, val = [], []
        for var, v in start.items():
            if var is None or var.id not in cols:
                continue
            first = cols[var.id]
            idx.append(np.arange(first, first + var.size))
            val.append(np.asarray(v, dtype=float).ravel())
        if idx:
            start_idx, start_val = np.concatenate(idx), np.concatenate(val)
    return StandardForm(A=A, c=c, row_lb=row_lb, row_ub=b, col_lb=col_lb, col_ub=col_ub, ints=ints, n_eq=n_eq,
                        offset=offset, start_idx=start_idx, start_val=start_val, chain=chain, inverse=inverse)


class Reporter:
    """Collects a solve's (wall s, incumbent, bound) points and writes one progress line each:
    ``progress(str)`` (or nothing when None); the values shown add cvxpy's ``offset`` and
    ``shown_offset`` (the constant time the caller adds)."""

    def __init__(self, progress, offset: float, shown_offset: float = 0.0):
        self.progress, self.add = progress, offset + shown_offset
        self.history: list[tuple[float, float | None, float | None]] = []

    def __call__(self, now: float, best: float | None, bound: float | None) -> None:
        self.history.append((now, best, bound))
        if self.progress is None:
            return
        add = self.add
        total = None if best is None else best + add
        gap = "" if total is None or bound is None else f", gap {100 * max(0.0, best - bound) / max(abs(total), 1e-12):.2f} %"
        self.progress(f"  {now:6.1f} s  incumbent {'-' if best is None else f'{best + add:.6g}'}"
                      f"  bound {'-' if bound is None else f'{bound + add:.6g}'}{gap}")

    def lost(self, detail: str, elapsed: float) -> MilpOutcome:
        """The outcome of a solve that gave no answer (a crash, the hard deadline): status
        "no_integer", with ``detail`` and the best incumbent it had reported."""
        if self.progress is not None:
            self.progress(f"  {detail}; the start schedule stands")
        best = next((h[1] for h in reversed(self.history) if h[1] is not None), None)
        return MilpOutcome(status="no_integer", objective=None, bound=None, solve_time_s=elapsed,
                           history=self.history, detail=f"{detail} (its best incumbent: {best})" if best is not None
                           else detail)


def finish(problem: cp.Problem, form: StandardForm, x: np.ndarray | None, optimal: bool, infeasible: bool,
           bound: float | None, gap_abs: float, elapsed: float, report: Reporter) -> MilpOutcome:
    """The outcome of a solve that answered: ``x`` (n,) the solver's best point or None,
    ``optimal``/``infeasible`` what it proved, ``bound`` its best bound (model units, without the
    offset; None or |bound| >= 1e49: none).  When ``x`` is given the problem's variables hold it
    (cvxpy's ``unpack_results``)."""
    bound = None if bound is None or not np.isfinite(bound) or abs(bound) >= 1e49 else float(bound)
    objective = None
    if x is not None:
        objective = float(form.c @ x)
        status = s.OPTIMAL if optimal else s.USER_LIMIT
        with warnings.catch_warnings():  # "Solution may be inaccurate" for a stopped search
            warnings.simplefilter("ignore")
            problem.unpack_results({"status": status, "primal": x, "value": objective}, form.chain, form.inverse)
        if optimal:
            kind = "optimal"
        elif bound is not None and objective - bound <= gap_abs * (1 + 1e-9):
            kind = "gap"
        else:
            kind = "time_limit"
    elif infeasible:
        kind = "infeasible"
    else:
        kind = "no_integer"
    if objective is not None and kind == "optimal":
        bound = objective if bound is None else min(bound, objective)
    report(elapsed, objective, bound)
    off = form.offset
    return MilpOutcome(status=kind, objective=None if objective is None else objective + off,
                       bound=None if bound is None else bound + off, solve_time_s=elapsed, history=report.history)
