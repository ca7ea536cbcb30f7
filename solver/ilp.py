"""MONeT's integer linear program, recompute-or-store (``normal``) mode, in cvxpy.

Variables (Shah et al., ICLR 2021, Sec. 4; rows are backward stages t = 0..T-1, columns forward
nodes i = 0..N-1):

* ``S[t, i]``: the output of forward node i is in memory at the start of stage t (``S[0]`` is what
  the forward pass keeps);
* ``R[t, i]``: node i is recomputed in stage t.

Constraints: a stage's backward node reads only values kept or recomputed in it
(``R[t, i] + S[t, i] >= 1`` for i in D(t)); a recomputed node reads only values kept or recomputed
before it in the stage (``R[t, j] <= R[t, i] + S[t, i]`` for an edge i -> j); a value is kept only if
it was kept or recomputed in the previous stage (``S[t+1, i] <= S[t, i] + R[t, i]``); random ops are
never recomputed; and the memory of the forward pass and of every stage fits the budget
(`solver.memory_model`).  Objective: recomputation time (forward and backward times are constant
in this mode).

Only variables that can matter are created (DESIGN.md, "drop R[t,i] that can never be useful"):
``R[t, i]`` exists only if stage t could need node i (i is read by the stage or an ancestor of what it
reads) and ``S[t, i]`` only if some stage from t on could need it.  The constraint matrices are
built as sparse matrices from index arrays, with no per-element Python loops over constraints.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from monet.graph import OpGraph
from monet.schedule import ancestors
from monet.solver.memory_model import MemoryModel

SOLVERS = {"CBC": cp.CBC, "HIGHS": cp.HIGHS, "SCIP": cp.SCIP}


class InfeasibleBudgetError(ValueError):
    """No schedule fits the budget; ``min_budget_bytes`` is the smallest that does (or a bound)."""

    def __init__(self, budget: int, min_budget: int | None, mode: str, exact: bool = True):
        self.budget_bytes = budget
        self.min_budget_bytes = min_budget
        gib = 2 ** 30
        if min_budget is None:
            msg = f"no schedule fits a budget of {budget} bytes ({budget / gib:.3f} GiB) in mode {mode}"
        else:
            word = "smallest feasible budget" if exact else "smallest budget found feasible"
            msg = (f"no schedule fits a budget of {budget} bytes ({budget / gib:.3f} GiB) in mode {mode}; "
                   f"the {word} is {min_budget} bytes ({min_budget / gib:.3f} GiB): "
                   f"use --budget {min_budget} or --min-budget")
        super().__init__(msg)


@dataclass
class ILPResult:
    """The solver's answer. Times in seconds, matrices (T, N) bool."""

    S: np.ndarray
    R: np.ndarray
    objective_s: float  # recomputation time + constant forward and backward time
    bound_s: float | None
    gap: float | None
    status: str  # "optimal" | "time_limit"
    solve_time_s: float
    build_time_s: float
    n_variables: int
    n_constraints: int
    solver: str


class _Problem:
    """Variables and constraints shared by the time-minimising and the budget-minimising ILPs."""

    def __init__(self, graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, mode: str):
        t0 = time.perf_counter()
        N, T = len(graph.fwd), len(graph.bwd)
        self.N, self.T, self.mode = N, T, mode
        anc = ancestors(graph)
        need = np.zeros((T, N), dtype=bool)  # stage t may need node i
        reads = np.zeros((T, N), dtype=bool)
        for t, node in enumerate(graph.bwd):
            for i in node.fwd_inputs:
                reads[t, i] = True
                need[t, i] = True
                need[t, list(anc[i])] = True
        random = np.array([n.random for n in graph.fwd], dtype=bool)
        useful = np.array([n.saved_bytes > 0 for n in graph.fwd], dtype=bool)
        need &= useful[None, :]
        if mode == "none":  # plain PyTorch: keep everything, recompute nothing
            allow_r = np.zeros((T, N), dtype=bool)
        else:
            allow_r = need & ~random[None, :]
        # S[t, i] can matter only if a stage from t on needs i
        later = np.flip(np.logical_or.accumulate(np.flip(need, axis=0), axis=0), axis=0)
        allow_s = later
        self.reads, self.allow_r, self.allow_s = reads, allow_r, allow_s

        r_idx = np.flatnonzero(allow_r.ravel())
        s_idx = np.flatnonzero(allow_s.ravel())
        self.r_idx, self.s_idx = r_idx, s_idx
        self.r = cp.Variable(len(r_idx), boolean=True, name="R") if len(r_idx) else None
        self.s = cp.Variable(len(s_idx), boolean=True, name="S") if len(s_idx) else None
        TN = T * N
        PR = sp.csr_matrix((np.ones(len(r_idx)), (r_idx, np.arange(len(r_idx)))), shape=(TN, max(len(r_idx), 1)))
        PS = sp.csr_matrix((np.ones(len(s_idx)), (s_idx, np.arange(len(s_idx)))), shape=(TN, max(len(s_idx), 1)))

        def flat(P, v):
            return P @ v if v is not None else np.zeros(TN)

        Rf, Sf = flat(PR, self.r), flat(PS, self.s)
        cons = []

        def rows(mask2d):
            idx = np.flatnonzero(mask2d.ravel())
            return sp.csr_matrix((np.ones(len(idx)), (np.arange(len(idx)), idx)), shape=(len(idx), TN)), len(idx)

        # 1. backward node t reads D(t): kept or recomputed
        E, k = rows(reads)
        if k:
            cons.append(E @ Rf + E @ Sf >= 1)
        # 2. keep only what was there: S[t+1, i] <= S[t, i] + R[t, i]
        if T > 1:
            nxt = np.zeros((T, N), dtype=bool)
            nxt[1:] = allow_s[1:]
            idx = np.flatnonzero(nxt.ravel())
            if len(idx):
                A1 = sp.csr_matrix((np.ones(len(idx)), (np.arange(len(idx)), idx)), shape=(len(idx), TN))
                A0 = sp.csr_matrix((np.ones(len(idx)), (np.arange(len(idx)), idx - N)), shape=(len(idx), TN))
                cons.append(A1 @ Sf <= A0 @ Sf + A0 @ Rf)
        # 3. a recomputed node's inputs are there: R[t, j] <= R[t, i] + S[t, i] for edges i -> j
        edges = [(i, n.id) for n in graph.fwd for i in n.fwd_inputs]
        if edges and self.r is not None:
            ei = np.array([e[0] for e in edges])
            ej = np.array([e[1] for e in edges])
            tt, ee = np.nonzero(allow_r[:, ej])  # stage, edge index where the consumer may be recomputed
            if len(tt):
                src = tt * N + ei[ee]
                dst = tt * N + ej[ee]
                m = len(tt)
                Aj = sp.csr_matrix((np.ones(m), (np.arange(m), dst)), shape=(m, TN))
                Ai = sp.csr_matrix((np.ones(m), (np.arange(m), src)), shape=(m, TN))
                cons.append(Aj @ Rf <= Ai @ Rf + Ai @ Sf)
        # 4. memory
        self.budget = cp.Parameter(nonneg=True, name="budget")
        self.budget_var = cp.Variable(nonneg=True, name="budget_var")
        self.mem = mem
        s0 = Sf[:N] if self.s is not None else np.zeros(N)
        self.fwd_mem = mem.fwd_const + mem.fwd_keep @ s0 if self.s is not None else mem.fwd_const
        # backward: per-stage rows of saved_bytes and out_bytes
        tt = np.repeat(np.arange(T), N)
        col = np.arange(TN)
        MS = sp.csr_matrix((np.tile(mem.saved_bytes, T), (tt, col)), shape=(T, TN))
        MR = sp.csr_matrix((np.tile(mem.out_bytes, T), (tt, col)), shape=(T, TN))
        # workspace of a recomputation larger than the stage's own backward needs: W[t] >= ws_i R[t, i]
        big = allow_r & (mem.fwd_workspace[None, :] > mem.bwd_extra[:, None])
        extra = mem.bwd_extra
        self.W = None
        if big.any():
            self.W = cp.Variable(T, nonneg=True, name="W")
            bt, bi = np.nonzero(big)
            m = len(bt)
            Ab = sp.csr_matrix((mem.fwd_workspace[bi], (np.arange(m), bt * N + bi)), shape=(m, TN))
            Bt = sp.csr_matrix((np.ones(m), (np.arange(m), bt)), shape=(m, T))
            cons.append(Bt @ self.W >= Ab @ Rf)
            cons.append(self.W >= extra)
            self.bwd_mem = mem.bwd_const + MS @ Sf + MR @ Rf + self.W
        else:
            self.bwd_mem = mem.bwd_const + extra + MS @ Sf + MR @ Rf
        self.cons = cons
        self.recompute_cost = np.tile(np.asarray(recompute_s, dtype=float), T)
        self.Rf = Rf
        self.build_time_s = time.perf_counter() - t0

    def memory_constraints(self, limit):
        return [self.fwd_mem <= limit, self.bwd_mem <= limit]

    def matrices(self) -> tuple[np.ndarray, np.ndarray]:
        T, N = self.T, self.N
        S = np.zeros(T * N, dtype=bool)
        R = np.zeros(T * N, dtype=bool)
        if self.s is not None:
            S[self.s_idx] = np.asarray(self.s.value).round() > 0.5
        if self.r is not None:
            R[self.r_idx] = np.asarray(self.r.value).round() > 0.5
        return S.reshape(T, N), R.reshape(T, N)

    def time_objective(self):
        if self.r is None:
            return cp.Constant(0.0)
        return self.recompute_cost[self.r_idx] @ self.r


def _solve(problem: cp.Problem, solver: str, time_limit: float, verbose: bool) -> float:
    name = solver.upper()
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
    kwargs: dict = {}
    if name == "CBC":
        kwargs = {"maximumSeconds": max(1, int(time_limit))}
    elif name == "HIGHS":
        kwargs = {"time_limit": float(time_limit)}
    elif name == "SCIP":
        kwargs = {"scip_params": {"limits/time": float(time_limit)}}
    t0 = time.perf_counter()
    try:
        problem.solve(solver=SOLVERS[name], verbose=verbose, **kwargs)
    except cp.error.SolverError:
        pass  # no incumbent in time, or infeasible: the caller reads problem.status
    return time.perf_counter() - t0


def _lp_bound(prob_vars, objective, constraints) -> float | None:
    """Optimal value of the LP relaxation: a lower bound on the ILP's optimum (None if unsolved)."""
    relaxed = cp.Problem(cp.Minimize(objective), constraints + [v <= 1 for v in prob_vars] + [v >= 0 for v in prob_vars])
    try:
        relaxed.solve(solver=cp.HIGHS) if "HIGHS" in cp.installed_solvers() else relaxed.solve()
    except cp.error.SolverError:
        return None
    return float(relaxed.value) if relaxed.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) else None


def solve_min_budget(graph: OpGraph, mem: MemoryModel, mode: str = "normal", solver: str = "CBC",
                     time_limit: float = 60.0, verbose: bool = False) -> tuple[int, bool]:
    """Smallest budget (bytes) for which a schedule exists in ``mode``.

    Solves ``min budget`` subject to the ILP's constraints.  Returns (bytes, proven): ``proven`` is
    False when the time limit stopped the solver, so a smaller budget may still be feasible.
    """
    P = _Problem(graph, mem, np.zeros(len(graph.fwd)), mode)
    b = P.budget_var
    problem = cp.Problem(cp.Minimize(b), P.cons + P.memory_constraints(b))
    _solve(problem, solver, time_limit, verbose)
    if b.value is None:
        raise RuntimeError(f"the solver found no schedule within {time_limit:.0f} s; raise --time-limit")
    S, R = P.matrices()
    # the value of the rounded schedule, which the budget must allow
    return int(np.ceil(mem.peak(S, R))), problem.status == cp.OPTIMAL


def solve_ilp(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: int, mode: str = "normal",
              solver: str = "CBC", time_limit: float = 60.0, constant_s: float = 0.0,
              verbose: bool = False) -> ILPResult:
    """Minimise recomputation time under a memory budget (bytes).

    Args:
        recompute_s: (N,) seconds to recompute each forward node.
        budget: bytes; the ILP's memory expressions (an upper bound of the executor's) must fit.
        mode: "normal" (recompute or store) or "none" (keep everything: plain PyTorch).
        solver: "CBC" (default), "HIGHS" or "SCIP".
        time_limit: seconds; the best schedule found by then is returned with its gap.
        constant_s: forward + backward time added to the objective (seconds).

    Raises:
        InfeasibleBudgetError: no schedule fits; names the smallest feasible budget.
        RuntimeError: the solver found no schedule within the time limit.
    """
    if mode not in ("none", "normal"):
        raise ValueError(f"mode {mode!r} is not available yet; choose 'none' or 'normal'")
    P = _Problem(graph, mem, recompute_s, mode)
    objective = P.time_objective()
    cons = P.cons + P.memory_constraints(float(budget))
    problem = cp.Problem(cp.Minimize(objective), cons)
    n_vars = sum(v.size for v in problem.variables())
    n_cons = sum(c.size for c in problem.constraints)
    t_solve = _solve(problem, solver, time_limit, verbose)
    status = problem.status
    if status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE) or (
            P.r is not None and P.r.value is None and status not in (cp.USER_LIMIT,)):
        if status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            least, proven = solve_min_budget(graph, mem, mode, solver, time_limit, verbose)
            raise InfeasibleBudgetError(int(budget), least, mode, exact=proven)
    if (P.r is not None and P.r.value is None) or (P.s is not None and P.s.value is None):
        raise RuntimeError(f"the solver ({solver}) found no schedule within {time_limit:.0f} s "
                           f"(status {status}); raise --time-limit or the budget")
    S, R = P.matrices()
    if mode == "none":
        S = S | P.allow_s
    obj = float(np.asarray(recompute_s, dtype=float) @ R.sum(axis=0)) + constant_s
    optimal = status == cp.OPTIMAL
    bound = obj if optimal else None
    if not optimal:
        lp = _lp_bound([v for v in (P.r, P.s, P.W) if v is not None and v is not P.W], objective, cons)
        bound = None if lp is None else lp + constant_s
    gap = 0.0 if optimal else (None if bound is None else max(0.0, (obj - bound) / obj) if obj > 0 else 0.0)
    return ILPResult(S=S, R=R, objective_s=obj, bound_s=bound, gap=gap,
                     status="optimal" if optimal else "time_limit", solve_time_s=t_solve,
                     build_time_s=P.build_time_s, n_variables=int(n_vars), n_constraints=int(n_cons),
                     solver=solver.upper())
