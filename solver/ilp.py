"""MONeT's integer linear program in cvxpy: recompute-or-store, with operator implementations.

Variables (Shah et al., ICLR 2021, Sec. 4; rows are backward stages t = 0..T-1, columns forward
nodes i = 0..N-1):

* ``S[t, i]``: the output of forward node i is in memory at the start of stage t (``S[0]`` is what
  the forward pass keeps);
* ``R[t, i]``: node i is recomputed in stage t.

Constraints: a stage's backward node reads only values kept or recomputed in it
(``R[t, i] + S[t, i] >= 1`` for i in D(t)); a recomputed node reads only values kept or recomputed
before it in the stage (``R[t, j] <= R[t, i] + S[t, i]`` for an edge i -> j); a value is kept only if
it was kept or recomputed in the previous stage (``S[t+1, i] <= S[t, i] + R[t, i]``); random ops
(dropout) are recomputed like any other, replaying the generator state saved before they ran
(`monet.rng`); and the memory of the forward pass and of every stage fits the budget
(`solver.memory_model`: in stage t, ``B[t]`` bounds the constants and gradients, ``Yb[t]`` the
forward values live while backward node t runs, and there is one row for the backward node and
one per node the stage may recompute, as MONeT's per-operator rows; what is live at each of them
is a chain ``Y[t, i] >= Y[t, next] - (terms between the two)`` over the stage's
`solver.memory_model.StageEvents`, with a helper ``L >= R[t, reader]``, ``L >= S[t+1, g]`` per
group and forward reader, so that a row holds O(1) terms, not one per group; a recomputation's
workspace stays in its own row).  Objective: recomputation time (forward and backward times are constant
in ``normal`` mode).

With implementation options (`solver.choices`; MONeT's ``conv``/``multiway``/``newnode`` modes)
one-hot ``M[o]`` picks one option per choice, once per node (not per stage: a choice per stage multiplies the variables for no schedule the executor can run);
a stage's reads under option o hold only if ``M[o]`` (``R + S >= M[o]``); an option's own values are
kept only under it (``S <= M[o]``); the memory rows gain ``fwd_opt @ M`` and ``bwd_opt @ M``; a
choice node's recomputation workspace and time are linearised exactly with ``Wr >= ws_o (R + M[o] - 1)``
and ``Q >= t_o (R + M[o] - 1)``; the objective adds each chosen option's forward and backward time.

Only variables that are likely to matter are created (an R[t, i] that can never be useful is
dropped): ``R[t, i]`` exists only if stage t could need node i (i is read by the stage or an ancestor
of what it reads) and ``S[t, i]`` only if some stage from t on could need it.  This is a
restriction, not an exact reduction: recomputing a node early, while its inputs are still kept, and
keeping it for a later stage can be cheaper (`tests/test_solver_fast_path.py` measures the loss
against the unpruned formulation, `plain_solve`).  The constraint matrices are
built as sparse matrices from index arrays; only the per-recomputation rows loop over stages.

Solving (`solve_ilp`): the LP relaxation (bound, roundings), a start from repaired schedules
improved by local search (`solver.repair.improve`), then CBC with that start; above `LARGE`
variables CBC is not run (it never answered within a minute there) and the search has its time.
"""
from __future__ import annotations

import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from monet.graph import OpGraph
from monet.schedule import ancestors
from monet.solver.cbc import solve_cbc
from monet.solver.memory_model import KEEP, KEEP_NEXT, LIVE, RECOMPUTE, MemoryModel
from monet.solver.repair import (drop_greedily, improve, replay, repaired_candidates, round_and_repair,
                                 smallest_candidate)
from monet.solver.structured import structured_candidates
from monet.solver.windows import drop_windows
from monet.terms import arg, fmt_size

SOLVERS = {"CBC": cp.CBC, "HIGHS": cp.HIGHS, "SCIP": cp.SCIP}
# Above this many variables CBC found no schedule better than its start within a minute on 2
# cores (ResNet-50 at batch 184: 91,000), so the time goes to the local search instead; HiGHS's
# presolve alone outlasted the test suite's 4 s limits there, so the rule holds for every solver
LARGE = 20000
# Above this many R and S variables not even the LP relaxation answers within a minute on 2 cores
# (a 12-layer GPT-2: 178,000 of them, 287,000 variables in all: no answer in 14 s; a 48-layer one
# held 7 GB building it), so no cvxpy problem is built at all: the search (`search`) alone gives
# the schedule, with no bound.  ResNet-50 at batch 184 (at most 204,000 variables in all) is below
HUGE = 150_000


class InfeasibleBudgetError(ValueError):
    """No schedule fits the budget; ``min_budget_bytes`` is the smallest found that does,
    ``lower_bytes`` the LP relaxation's lower bound on it (`min_budget_relaxation`) when known."""

    def __init__(self, budget: int, min_budget: int | None, mode: str, exact: bool = True,
                 lower_bytes: float | None = None):
        self.budget_bytes = budget
        self.min_budget_bytes = min_budget
        self.lower_bytes = lower_bytes
        if min_budget is None:
            msg = f"no schedule fits a budget of {budget} bytes ({fmt_size(budget)}) in mode {mode}"
        else:
            word = "smallest feasible budget" if exact else "smallest budget found feasible"
            how = arg(f'budget={min_budget} (if_infeasible="smallest" solves there instead of raising), or '
                      'budget="min" for the smallest budget whose recomputation is worth it (at or above this one; '
                      "the search is kept, so either returns soon)",
                      f"--budget {min_budget} or --min-budget")
            msg = (f"no schedule fits a budget of {budget} bytes ({fmt_size(budget)}) in mode {mode}; "
                   f"the {word} is {min_budget} bytes ({fmt_size(min_budget)}): use {how}")
        if lower_bytes is not None and budget < lower_bytes:
            msg += (f" (infeasible: in the ILP's memory model no schedule fits below {int(lower_bytes)} bytes, "
                    f"{fmt_size(lower_bytes)}, by its LP relaxation)")
        super().__init__(msg)


@dataclass
class ILPResult:
    """The solver's answer. Times in seconds, matrices (T, N) bool."""

    S: np.ndarray  # (T, N): node kept (any of its groups) at the start of stage t
    R: np.ndarray
    objective_s: float  # recomputation time + constant forward and backward time
    bound_s: float | None
    gap: float | None
    status: str  # "optimal" | "gap" (proven within the gap asked) | "time_limit" | "heuristic" | "no_integer"
    solve_time_s: float
    build_time_s: float
    n_variables: int
    n_constraints: int
    solver: str
    M: np.ndarray | None = None  # (O,) chosen implementation options (None without options)
    history: list = None  # (wall s, incumbent, bound) points of the solve, model units
    O: np.ndarray | None = None  # (G,) groups offloaded to the host (None without offload)


def allowed(graph: OpGraph, mem: MemoryModel, mode: str = "normal", prune: bool = True):
    """Where the ILP has variables: (reads (T, G) bool: backward node t reads group g under some
    option; allow_r (T, N): node i may be recomputed in stage t, an ancestor of what the stage
    reads (none in mode "none"); allow_s (T, G): group g may be kept at the start of stage t, some
    stage from t on may need it).  Without ``prune``, MONeT's formulation as written: R and S
    everywhere.  The repairs and the greedy of `solver.repair` take ``allow_s``."""
    N, T, G = len(graph.fwd), len(graph.bwd), len(mem.groups)
    gnode = mem.group_node
    anc = ancestors(graph)
    rt, rg = mem.reads[:, 0], mem.reads[:, 1]
    reads = np.zeros((T, G), dtype=bool)  # backward node t reads group g (under some option)
    reads[rt, rg] = True
    # stage t may need node i (read, or an ancestor of a read)
    read_nodes = np.zeros((T, N), dtype=bool)
    read_nodes[rt, gnode[rg]] = True
    need = read_nodes | (read_nodes.astype(np.float32) @ anc.astype(np.float32) > 0)
    useful = np.zeros(N, dtype=bool)
    useful[gnode] = True
    need &= useful[None, :]
    if not prune:  # MONeT's plain formulation, for contrast (`benchmarks/bench_solver.py --plain`): R everywhere
        need = np.broadcast_to(useful[None, :], (T, N)).copy()
    allow_r = np.zeros((T, N), dtype=bool) if mode == "none" else need
    eg, ej = mem.read_edges[:, 0], mem.read_edges[:, 1]  # forward node ej reads group eg
    need_g = reads.copy()
    if len(eg):
        tt, ee = np.nonzero(allow_r[:, ej])
        need_g[tt, eg[ee]] = True
    # S[t, g] can matter only if a stage from t on needs g
    allow_s = np.flip(np.logical_or.accumulate(np.flip(need_g, axis=0), axis=0), axis=0)
    if not prune:
        allow_s = np.ones((T, G), dtype=bool)
    return reads, allow_r, allow_s


class Problem:
    """Variables and constraints shared by the time-minimising and the budget-minimising ILPs.

    R is (T, N) over forward nodes; S is (T, G) over the memory model's groups (a node's values
    read by backward nodes, and those read only by recomputations).  Without ``recompute_rows``
    the memory rows per recomputed node are left out (a relaxation: `lp_relaxation`'s bound).

    The ILP is built one constraint family per method, as Checkmate's ``ILPSolver`` does
    (Jain et al., MLSys 2020): `_variables`, then correctness (`_reads`, `_keeps`, `_inputs`,
    `_choices`), memory (`_forward_memory` with `_rng_states` and `_offload`, `_backward_memory`
    with `_recompute_rows`) and the objective (`_objective`).  Each appends to ``cons``; the memory
    families leave ``fwd_mem`` and ``bwd_rows`` for `memory_constraints`.
    """

    def __init__(self, graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, mode: str, relax: bool = False,
                 prune: bool = True, recompute_rows: bool = True):
        t0 = time.perf_counter()
        self.graph, self.mem = graph, mem
        N, T, G, O = len(graph.fwd), len(graph.bwd), len(mem.groups), mem.n_options
        self.N, self.T, self.G, self.O, self.mode = N, T, G, O, mode
        self.reads, self.allow_r, self.allow_s = allowed(graph, mem, mode, prune)
        self.cons = []
        self._variables(relax)
        self._reads()
        self._keeps()
        self._inputs()
        self._choices()
        # memory, in units of `scale` bytes so that coefficients are near 1 (byte counts of 1e9
        # next to 0/1 variables make the LP badly conditioned: slow and inaccurate)
        self.scale = float(max(mem.bwd_const.max(), mem.fwd_const.max(), 1.0))
        self.budget_var = cp.Variable(nonneg=True, name="budget")
        rng_u = self._forward_memory(relax)
        self._backward_memory(rng_u, recompute_rows)
        self._objective(recompute_s)
        self.build_time_s = time.perf_counter() - t0

    # -- variables ---------------------------------------------------------------------------

    def _variables(self, relax: bool) -> None:
        """R, S (only where `allowed`), M (one per implementation option), as cvxpy variables,
        and their flat (T * N), (T * G) and (O,) expressions ``Rf``, ``Sf``, ``Mv``."""
        T, N, G, O = self.T, self.N, self.G, self.O
        self.r_idx = np.flatnonzero(self.allow_r.ravel())
        self.s_idx = np.flatnonzero(self.allow_s.ravel())
        self.kind = {"bounds": [0, 1]} if relax else {"boolean": True}  # relax: the LP relaxation
        self.r = cp.Variable(len(self.r_idx), name="R", **self.kind) if len(self.r_idx) else None
        self.s = cp.Variable(len(self.s_idx), name="S", **self.kind) if len(self.s_idx) else None
        self.m = cp.Variable(O, name="M", **self.kind) if O else None
        self.TN, self.TG = T * N, T * G
        PR = sp.csr_matrix((np.ones(len(self.r_idx)), (self.r_idx, np.arange(len(self.r_idx)))),
                           shape=(self.TN, max(len(self.r_idx), 1)))
        PS = sp.csr_matrix((np.ones(len(self.s_idx)), (self.s_idx, np.arange(len(self.s_idx)))),
                           shape=(self.TG, max(len(self.s_idx), 1)))
        self.Rf = PR @ self.r if self.r is not None else np.zeros(self.TN)
        self.Sf = PS @ self.s if self.s is not None else np.zeros(self.TG)
        self.Mv = self.m if self.m is not None else np.zeros(max(O, 1))

    @staticmethod
    def sel(idx, width, weights=None):
        """Sparse (len(idx), width) matrix picking entries idx of a flat vector."""
        w = np.ones(len(idx)) if weights is None else weights
        return sp.csr_matrix((w, (np.arange(len(idx)), idx)), shape=(len(idx), max(width, 1)))

    # -- correctness -------------------------------------------------------------------------

    def _reads(self) -> None:
        """1. Backward node t reads group g: kept, or its node recomputed in the stage (if its
        option is chosen).  Reads under several options of one choice share one row, R + S >= the
        sum of their M (the options exclude each other, so the sum is 1 exactly when one of them
        is chosen): a row per option (R + S >= M[o]) let the LP relaxation split M evenly over the
        five convolution backward options of ResNet-50 and keep each input at S = 0.2, a bound at
        70 % of the plain peak equal to the no-recomputation time (0.6139 s, where the
        implementations fixed gave 0.6251 s)."""
        mem, N, G, sel = self.mem, self.N, self.G, self.sel
        rt, rg, ro = mem.reads[:, 0], mem.reads[:, 1], mem.reads[:, 2]
        gnode = mem.group_node
        uncond = ro < 0
        if uncond.any():
            tt, gg = rt[uncond], rg[uncond]
            self.cons.append(sel(tt * N + gnode[gg], self.TN) @ self.Rf + sel(tt * G + gg, self.TG) @ self.Sf >= 1)
        if (~uncond).any():
            choice = np.array([mem.options[o].choice for o in ro[~uncond]])
            keys, row = np.unique(np.stack([rt[~uncond], rg[~uncond], choice], axis=1), axis=0, return_inverse=True)
            tt, gg = keys[:, 0], keys[:, 1]
            pick = sp.csr_matrix((np.ones(len(row)), (row.ravel(), ro[~uncond])), shape=(len(keys), max(self.O, 1)))
            pick.data[:] = 1.0  # an option read twice in the same row counts once
            self.cons.append(sel(tt * N + gnode[gg], self.TN) @ self.Rf + sel(tt * G + gg, self.TG) @ self.Sf
                             >= pick @ self.Mv)

    def _keeps(self) -> None:
        """2. Keep only what was there: S[t+1, g] <= S[t, g] + R[t, node(g)]."""
        N, G, sel = self.N, self.G, self.sel
        tt, gg = np.nonzero(self.allow_s[1:])
        if len(tt):
            self.cons.append(sel((tt + 1) * G + gg, self.TG) @ self.Sf
                             <= sel(tt * G + gg, self.TG) @ self.Sf
                             + sel(tt * N + self.mem.group_node[gg], self.TN) @ self.Rf)

    def _inputs(self) -> None:
        """3. A recomputed node's inputs are there: R[t, j] <= R[t, node(g)] + S[t, g]."""
        mem, N, G, sel = self.mem, self.N, self.G, self.sel
        eg, ej = mem.read_edges[:, 0], mem.read_edges[:, 1]  # forward node ej reads group eg
        if len(eg) and self.r is not None:
            tt, ee = np.nonzero(self.allow_r[:, ej])
            if len(tt):
                self.cons.append(sel(tt * N + ej[ee], self.TN) @ self.Rf
                                 <= sel(tt * N + mem.group_node[eg[ee]], self.TN) @ self.Rf
                                 + sel(tt * G + eg[ee], self.TG) @ self.Sf)

    def _choices(self) -> None:
        """3b. One implementation per choice; an option's own values are kept only under it."""
        mem, G, O = self.mem, self.G, self.O
        if not O:
            return
        C = sp.csr_matrix((np.ones(O), ([mem.options[o].choice for o in range(O)], np.arange(O))),
                          shape=(len(mem.choices), O))
        self.cons.append(C @ self.Mv == 1)
        tt, gg = np.nonzero(self.allow_s & (mem.group_option[None, :] >= 0))
        if len(tt):
            self.cons.append(self.sel(tt * G + gg, self.TG) @ self.Sf <= self.sel(mem.group_option[gg], O) @ self.Mv)

    # -- memory ------------------------------------------------------------------------------

    def _forward_memory(self, relax: bool):
        """4. The forward pass's rows ``fwd_mem`` (N,): constants, kept groups, options, the
        generator states (`_rng_states`) and the offloaded groups (`_offload`); returns the
        generator states' term, which every backward stage holds too."""
        mem, G, O, scale = self.mem, self.G, self.O, self.scale
        fwd = mem.fwd_const / scale
        if self.s is not None:
            fwd = fwd + sp.csr_matrix(mem.fwd_keep / scale) @ self.Sf[:G]
        if O:
            fwd = fwd + sp.csr_matrix(mem.fwd_opt / scale) @ self.Mv
        fwd, rng_u = self._rng_states(fwd)
        self.fwd_mem = self._offload(fwd, relax)
        return rng_u

    def _rng_states(self, fwd):
        """Generator states of recomputed random nodes (`monet.rng`): Z[i] >= R[t, i], their bytes
        from node i on in the forward pass and through every stage.  Returns (fwd, stage term)."""
        N, scale, sel = self.N, self.scale, self.sel
        rng_bytes = self.mem.rng_state_bytes if self.mem.rng_state_bytes is not None else np.zeros(N)
        zi = np.flatnonzero((rng_bytes > 0) & self.allow_r.any(axis=0))
        if not len(zi):
            return fwd, 0.0
        Z = cp.Variable(len(zi), nonneg=True, name="Z")
        tt, kk = np.nonzero(self.allow_r[:, zi])
        self.cons.append(sel(kk, len(zi)) @ Z >= sel(tt * N + zi[kk], self.TN) @ self.Rf)
        after = (np.arange(N)[:, None] >= zi[None, :]) * (rng_bytes[zi][None, :] / scale)
        return fwd + sp.csr_matrix(after) @ Z, rng_bytes[zi] / scale @ Z

    def _offload(self, fwd, relax: bool):
        """Offload to host (`solver.offload`): O[g] over the allowed groups that S keeps from the
        forward pass through their off-device window; their bytes leave the forward rows and the
        exposed transfer time enters the objective (``offload_terms``).  Returns fwd."""
        G, N, sel, allow_s, allow_r = self.G, self.N, self.sel, self.allow_s, self.allow_r
        off, self.o, self.o_idx, self.offload_terms = self.mem.offload, None, np.zeros(0, dtype=int), []
        self.offload = off
        if off is None or self.mode == "none":
            return fwd
        oi = [g for g in np.flatnonzero(off.allowed & off.candidate)
              if allow_s[:max(1, int(off.prefetch[g])), g].all()]
        if not oi:
            return fwd
        oi = np.array(oi, dtype=int)
        self.o, self.o_idx = cp.Variable(len(oi), name="O", **self.kind), oi
        # O[g] <= S[t, g] for t < max(prefetch, 1)
        kk = np.concatenate([np.full(max(1, int(off.prefetch[g])), k) for k, g in enumerate(oi)])
        tt = np.concatenate([np.arange(max(1, int(off.prefetch[g]))) for g in oi])
        self.cons.append(sel(kk, len(oi)) @ self.o <= sel(tt * G + oi[kk], self.TG) @ self.Sf)
        # R[t, j] + O[g] <= 1 for t < prefetch, j = g's node or a forward reader of it
        pairs = [(k, t, j) for k, g in enumerate(oi) for t in range(int(off.prefetch[g]))
                 for j in np.flatnonzero(off.readers[g]) if allow_r[t, j]]
        if pairs and self.r is not None:
            pk, pt, pj = (np.array(c, dtype=int) for c in zip(*pairs))
            self.cons.append(sel(pt * N + pj, self.TN) @ self.Rf + sel(pk, len(oi)) @ self.o <= 1)
        fwd = fwd - sp.csr_matrix(off.fwd_off()[:, oi] / self.scale) @ self.o
        # exposed transfer time, each direction (the copies share one stream)
        for c, total in ((off.c_out, off.fwd_total), (off.c_in, off.bwd_total)):
            X = cp.Variable(nonneg=True)
            self.cons += [X >= c[oi] @ self.o, X >= off.x[oi] @ self.o - total]
            self.offload_terms.append(X)
        return fwd

    def _backward_memory(self, rng_u, recompute_rows: bool) -> None:
        """4b. Backward stages (rows of `solver.memory_model`): B[t] >= the constants, gradients and
        generator states of stage t; Yb[t] >= the forward values live while backward node t runs
        (`MemoryModel.kept_at_backward`); one row for the backward node (``B + Yb + extra``) and,
        with ``recompute_rows``, one per node the stage may recompute (`_recompute_rows`)."""
        mem, T, N, G, O, scale = self.mem, self.T, self.N, self.G, self.O, self.scale
        allow_s, allow_r = self.allow_s, self.allow_r
        B = cp.Variable(T, nonneg=True, name="B")
        b_expr = mem.bwd_const / scale + rng_u
        if O and mem.live_opt is not None and mem.live_opt.any():
            b_expr = b_expr + sp.csr_matrix(mem.live_opt / scale) @ self.Mv
        if self.o is not None:
            b_expr = b_expr - sp.csr_matrix(self.offload.bwd_off()[:, self.o_idx] / scale) @ self.o
        self.cons.append(B >= b_expr)
        held = mem.held()
        ht, hg = np.nonzero(held & allow_s)
        nt, ng = np.nonzero(~held[:-1] & allow_s[1:]) if T > 1 else (np.zeros(0, int),) * 2
        bt, bj = np.nonzero(allow_r & (mem.bwd_read_bytes > 0))
        Yb = cp.Variable(T, nonneg=True, name="Yb")
        self.cons.append(Yb >= sp.csr_matrix((np.concatenate([mem.saved_bytes[hg], mem.saved_bytes[ng]]) / scale,
                                               (np.concatenate([ht, nt]),
                                                np.concatenate([ht * G + hg, (nt + 1) * G + ng]))),
                                              shape=(T, self.TG)) @ self.Sf
                         + sp.csr_matrix((mem.bwd_read_bytes[bt, bj] / scale, (bt, bt * N + bj)),
                                         shape=(T, self.TN)) @ self.Rf)
        extra = mem.bwd_extra / scale
        if O:
            extra = extra + sp.csr_matrix(mem.bwd_opt / scale) @ self.Mv
        self.bwd_rows = [B + Yb + extra]
        if recompute_rows:
            self._recompute_rows(B, Yb, held)

    def _recompute_rows(self, B, Yb, held) -> None:
        """The rows while node i recomputes: B[t] + Y[t, i] + (outputs + workspace of i) R[t, i],
        with Y[t, i] >= Y[t, next row] - (the stage's events between the two), Y[t, last] linked
        to Yb[t], and L[l] >= R[t, reader], L[l] >= L[l + 1] or S[t + 1, group] (`StageEvents`)."""
        mem, T, N, G, scale, sel = self.mem, self.T, self.N, self.G, self.scale, self.sel
        allow_r = self.allow_r
        has_ws = np.zeros(N, dtype=bool)
        has_ws[[i for i, _, _ in mem.rec_ws]] = True
        row_t, row_i, link, lam, ws_rows = [], [], [], [], []
        n_rows = n_lam = 0
        for t in range(T):
            nodes = np.flatnonzero(allow_r[t])
            if not len(nodes):
                continue
            ev = mem.stage_events(t, nodes, held[t])
            # events between row a - 1 and row a (row len(nodes): backward node t) link them
            seg = np.searchsorted(nodes, ev.pos, side="left")
            on = seg > 0
            col = ev.index[on].copy()
            col[ev.kind[on] == KEEP] += t * G
            col[ev.kind[on] == KEEP_NEXT] += (t + 1) * G
            col[ev.kind[on] == RECOMPUTE] += t * N
            col[ev.kind[on] == LIVE] += n_lam
            nxt = (ev.kind[on] != KEEP_NEXT) | (t + 1 < T)
            link.append((n_rows + seg[on][nxt] - 1, ev.kind[on][nxt], col[nxt], ev.coef[on][nxt]))
            nl = len(ev.lam_group)
            lam.append((np.full(nl, t), n_lam + np.arange(nl), ev.lam_reader, ev.lam_group, ev.lam_last))
            row_t += [t] * len(nodes)
            row_i += nodes.tolist()
            ws_rows += [(n_rows + a, t, i) for a, i in enumerate(nodes) if has_ws[i]]
            n_rows += len(nodes)
            n_lam += nl
        if not n_rows:
            return
        row_t, row_i = np.array(row_t), np.array(row_i)
        Y = cp.Variable(n_rows, nonneg=True, name="Y")
        last = np.ones(n_rows, dtype=bool)
        last[:-1] = row_t[1:] != row_t[:-1]
        L = cp.Variable(n_lam, nonneg=True, name="L") if n_lam else None
        lt, li, lk, lg, ll = (np.concatenate(x) for x in zip(*lam)) if n_lam else (np.zeros(0, int),) * 5
        if n_lam:
            self.cons.append(L[li] >= sel(lt * N + lk, self.TN) @ self.Rf)
            more = np.flatnonzero(~ll)
            if len(more):
                self.cons.append(L[li[more]] >= L[li[more] + 1])
            fin = np.flatnonzero(ll & (lt + 1 < T))
            if len(fin):
                self.cons.append(L[li[fin]] >= sel((lt[fin] + 1) * G + lg[fin], self.TG) @ self.Sf)
        er, ek, ec, ev_coef = (np.concatenate(x) for x in zip(*link))
        terms = 0
        for k, var, width in ((KEEP, self.Sf, self.TG), (KEEP_NEXT, self.Sf, self.TG), (RECOMPUTE, self.Rf, self.TN),
                              (LIVE, L, n_lam)):
            m = ek == k
            if m.any():
                terms = terms + sp.csr_matrix((ev_coef[m] / scale, (er[m], ec[m])), shape=(n_rows, width)) @ var
        nxt_y = np.flatnonzero(~last)
        self.cons.append(Y >= sp.csr_matrix((np.ones(len(nxt_y)), (nxt_y, nxt_y + 1)), shape=(n_rows, n_rows)) @ Y
                         + sp.csr_matrix((np.ones(last.sum()), (np.flatnonzero(last), row_t[last])),
                                         shape=(n_rows, T)) @ Yb
                         - terms)
        coef = (mem.out_bytes[row_i] + mem.fwd_workspace[row_i]) / scale
        Ut = sp.csr_matrix((np.ones(n_rows), (np.arange(n_rows), row_t)), shape=(n_rows, T))
        expr = Ut @ B + Y + sp.csr_matrix((coef, (np.arange(n_rows), row_t * N + row_i)),
                                          shape=(n_rows, self.TN)) @ self.Rf
        if ws_rows:
            # a choice node's workspace under its chosen option: Wr >= ws_o (R[t, i] + M[o] - 1)
            Wr = cp.Variable(len(ws_rows), nonneg=True, name="Wr")
            wr_i = np.array([i for _, _, i in ws_rows])
            wr_t = np.array([t for _, t, _ in ws_rows])
            for i, o, w in mem.rec_ws:
                k = np.flatnonzero(wr_i == i)
                if len(k):
                    self.cons.append(Wr[k] >= (w / scale) * (sel(wr_t[k] * N + i, self.TN) @ self.Rf + self.Mv[o] - 1))
            expr = expr + sp.csr_matrix((np.ones(len(ws_rows)), ([r for r, _, _ in ws_rows], np.arange(len(ws_rows)))),
                                        shape=(n_rows, len(ws_rows))) @ Wr
        self.bwd_rows.append(expr)

    # -- objective ---------------------------------------------------------------------------

    def _objective(self, recompute_s) -> None:
        """5. Time: recomputations (per option for choice nodes whose options differ: Q[t] >= t_o
        (R[t, i] + M[o] - 1)) and the options' own times (``opt_time``); `time_objective` sums them."""
        mem, T, N, O, sel = self.mem, self.T, self.N, self.O, self.sel
        rec = np.asarray(recompute_s, dtype=float).copy()
        q_terms = []
        by_node: dict[int, list[int]] = {}
        for o, opt in enumerate(mem.options):
            if opt.node >= 0:
                by_node.setdefault(opt.node, []).append(o)
        self.opt_time = np.zeros(O)
        for o, opt in enumerate(mem.options):
            t_o = sum(float(opt.bwd_time[t]) for t in opt.governed)
            if opt.node >= 0:
                t_o += float(opt.fwd_time[opt.node])
            self.opt_time[o] = t_o
        for i, opts in by_node.items():
            times = np.array([mem.options[o].fwd_recompute[i] for o in opts])
            ts = np.flatnonzero(self.allow_r[:, i])
            if times.max() - times.min() <= 0.01 * max(times.max(), 1e-12) or not len(ts):
                rec[i] = times.max()
                continue
            rec[i] = 0.0
            Q = cp.Variable(len(ts), nonneg=True, name=f"Q{i}")
            Ri = sel(ts * N + i, self.TN) @ self.Rf
            for o, t_o in zip(opts, times):
                self.cons.append(Q >= t_o * (Ri + self.Mv[o] - 1))
            # valid for every option, and what keeps the LP relaxation honest: with only the rows
            # above, M split 0.99 / 0.01 made R <= 0.01 free, and the relaxation of ResNet-50 at
            # 70 % recomputed ReLUs a hundredth at a time over 100 stages at no cost (its bound
            # 0.6139 s, the no-recomputation time; 0.6250 s with this row)
            self.cons.append(Q >= times.min() * Ri)
            q_terms.append(cp.sum(Q))
        self.q_terms = q_terms
        self.recompute_cost = np.tile(rec, T)

    def memory_constraints(self, limit):
        """Peak <= limit; ``limit`` in bytes (a number) or a variable in units of ``scale`` bytes."""
        if isinstance(limit, (int, float)):
            limit = limit / self.scale
        return [self.fwd_mem <= limit] + [r <= limit for r in self.bwd_rows]

    def matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """(S (T, G), R (T, N)) as bool arrays from the solver's values."""
        T, N, G = self.T, self.N, self.G
        S = np.zeros(T * G, dtype=bool)
        R = np.zeros(T * N, dtype=bool)
        if self.s is not None:
            S[self.s_idx] = np.asarray(self.s.value) > 0.5
        if self.r is not None:
            R[self.r_idx] = np.asarray(self.r.value) > 0.5
        return S.reshape(T, G), R.reshape(T, N)

    def integral(self) -> bool:
        """True when the solver's values exist, are 0/1 and, rounded, satisfy every dependency constraint.

        A CBC stopped by its time limit may hand back a fractional point, or an integral point of a
        node it had not finished, through cvxpy: neither is trusted.  Only the constraints among
        the 0/1 variables (R, S, M, O) are checked: the others bound continuous helpers from below
        (B, Yb, Y, L, Z, Wr, Q: what lives in a stage, the time of a choice), which any 0/1 point
        satisfies with large enough helpers, and the memory rows are not in ``cons`` (the callers
        check the schedule's peak).  cylp's CBC (``through_cvxpy``) hands back helper values that
        violate their rows by whole units where the C interface's agree (UserNet in full mode,
        the stage chains of `solver.memory_model.StageEvents`): checking them refused its
        optimal schedules.
        """
        binary = [v for v in (self.r, self.s, self.m, self.o) if v is not None]
        for v in binary:
            if v.value is None or np.max(np.abs(v.value - np.round(v.value)), initial=0) > 1e-4:
                return False
        ids = {v.id for v in binary}
        saved = [(v, v.value) for v in binary]
        for v, val in saved:
            v.value = np.round(val)
        try:
            return all(np.max(c.violation(), initial=0) <= 1e-6 for c in self.cons
                       if all(v.id in ids for v in c.variables()))
        finally:
            for v, val in saved:
                v.value = val

    def fractional_s(self) -> np.ndarray | None:
        """(T, G) fractional S from the solver's values, or None."""
        if self.s is None or self.s.value is None:
            return None
        out = np.zeros(self.T * self.G)
        out[self.s_idx] = np.clip(self.s.value, 0, 1)
        return out.reshape(self.T, self.G)

    def time_objective(self):
        """Recomputation time plus the time of the chosen implementations (seconds)."""
        obj = cp.Constant(0.0) if self.r is None else self.recompute_cost[self.r_idx] @ self.r
        if self.m is not None:
            obj = obj + self.opt_time @ self.m
        for q in self.q_terms + self.offload_terms:
            obj = obj + q
        return obj

    def chosen_offload(self) -> np.ndarray | None:
        """(G,) bool offloaded groups from the solver's values (None without offload)."""
        if self.o is None:
            return None if self.offload is None else np.zeros(self.G, dtype=bool)
        out = np.zeros(self.G, dtype=bool)
        if self.o.value is not None:
            out[self.o_idx] = np.asarray(self.o.value) > 0.5
        return out

    def chosen_options(self) -> np.ndarray | None:
        """(O,) 0/1 options from the solver's values (None if there are no options or no values)."""
        if self.m is None or self.m.value is None:
            return None
        return np.asarray(self.m.value) > 0.5


# The public name (tests and tools build the ILP's variables and constraints with it); the module's
# own functions keep the private one until the offload and attention branches are merged.


@dataclass
class _Run:
    """One MIP solve: cvxpy's status, the solver's bound (model units, None if unknown), seconds,
    and (wall s, incumbent, bound) progress points."""

    status: str
    bound: float | None
    seconds: float
    history: list
    stopped_at_gap: bool = False


def _solve(problem: cp.Problem, solver: str, time_limit: float, verbose: bool, start: dict | None = None,
           gap_abs: float = 0.0, progress=None, shown_offset: float = 0.0, through_cvxpy: bool = False) -> _Run:
    """Solve ``problem``; with CBC through its C interface (`solver.cbc`: MIP start ``start``,
    wall-clock ``time_limit``, stop at ``gap_abs``, the bound, progress lines), else (or with
    ``through_cvxpy``, for MONeT's formulation as written) through cvxpy's own solver calls."""
    name = solver.upper()
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
    if name == "CBC" and not through_cvxpy:
        out = solve_cbc(problem, time_limit=time_limit, gap_abs=gap_abs, start=start, progress=progress,
                        verbose=verbose, shown_offset=shown_offset)
        status = {"optimal": cp.OPTIMAL, "gap": cp.USER_LIMIT, "time_limit": cp.USER_LIMIT,
                  "infeasible": cp.INFEASIBLE}.get(out.status, cp.SOLVER_ERROR)
        return _Run(status, out.bound, out.solve_time_s, out.history, out.status == "gap")
    kwargs: dict = {}
    if name == "CBC":
        kwargs = {"maximumSeconds": max(1, int(time_limit))}  # CPU seconds, overrun by root cuts
    elif name == "HIGHS":
        kwargs = {"time_limit": float(time_limit), "mip_abs_gap": float(gap_abs)}
    elif name == "SCIP":
        kwargs = {"scip_params": {"limits/time": float(time_limit), "limits/absgap": float(gap_abs)}}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():  # "Solution may be inaccurate": checked by Problem.integral
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            problem.solve(solver=SOLVERS[name], verbose=verbose, **kwargs)
    except cp.error.SolverError:
        pass  # no incumbent in time, or infeasible: the caller reads problem.status
    status = problem.status or cp.SOLVER_ERROR
    bound = None
    if status == cp.OPTIMAL and problem.value is not None:
        bound = float(problem.value)
    return _Run(status, bound, time.perf_counter() - t0, [])


def lp_relaxation(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: float, mode: str,
                  time_limit: float) -> tuple[float | None, np.ndarray | None, np.ndarray | None]:
    """The LP relaxation at ``budget`` bytes: (optimal recomputation time in seconds, a lower bound
    on the ILP's optimum; fractional S (T, G); fractional M (O,) or None without options), or
    (None, None, None) if it has no solution in time.

    Solved with HiGHS's dual simplex through scipy (`cp.SCIPY`; scipy comes with cvxpy), which
    needs no extra package, where CBC's own LP takes twice as long (HiGHS's interior point
    method: 93 s, its PDLP: no answer in 120 s).  The memory rows per recomputed node are left
    out (``recompute_rows``): a weaker relaxation in principle, but on ResNet-50 at batch 184 its
    bound was the same at 70 / 50 / 33 % of the plain peak (0.6249 / 0.6336 / 0.6411 s) in 12 /
    17 / 27 s instead of 22 / 44 / 58 s.  scipy's HiGHS releases the GIL: `solve_ilp` and
    `solver.portfolio.solve_full` run it in a thread next to the local search at full scale.
    """
    P = Problem(graph, mem, recompute_s, mode, relax=True, recompute_rows=False)
    relaxed = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(float(budget)))
    if not _solve_lp(relaxed, time_limit):
        return None, None, None
    frac_m = None if P.m is None or P.m.value is None else np.clip(np.asarray(P.m.value, dtype=float), 0, 1)
    return float(relaxed.value), P.fractional_s(), frac_m


def min_budget_relaxation(graph: OpGraph, mem: MemoryModel, mode: str = "normal",
                          time_limit: float = 60.0) -> tuple[float | None, np.ndarray | None]:
    """A lower bound (bytes) on the smallest budget any schedule fits in the ILP's memory model:
    the LP relaxation of `solve_min_budget`'s ILP, with the memory rows per recomputed node left
    out as in `lp_relaxation` (a weaker relaxation, so still a bound), and its fractional S (T, G)
    (rounded by `solver.repair` into candidates); (None, None) if HiGHS gives no answer within
    ``time_limit`` seconds.

    The ILP's memory is an upper bound of the simulator's (within about 1 %), so a schedule the
    simulator fits may sit slightly below it: VGG-16 at batch 176 has 56.96 % of its plain peak
    here (0.2 s) and a schedule simulated at 56.94 %.  Budgets below the bound are infeasible in
    the model; a schedule found at or below it is the model's smallest.
    """
    P = Problem(graph, mem, np.zeros(len(graph.fwd)), mode, relax=True, recompute_rows=False)
    b = P.budget_var
    relaxed = cp.Problem(cp.Minimize(b), P.cons + P.memory_constraints(b))
    if not _solve_lp(relaxed, time_limit):
        return None, None
    return float(relaxed.value) * P.scale, P.fractional_s()


def _solve_lp(relaxed: cp.Problem, time_limit: float) -> bool:
    """Solve an LP relaxation with HiGHS through scipy (see `lp_relaxation` for why); True when it
    has an optimal value within ``time_limit`` seconds, or at all for an LP of at most `LARGE`
    variables, whatever ``time_limit`` (docs/design.md, "Note [Small problems are solved whole]")."""
    options = {"method": "highs"}
    if sum(v.size for v in relaxed.variables()) > LARGE:
        options["time_limit"] = float(time_limit)
    try:
        relaxed.solve(solver=cp.SCIPY, scipy_options=options)
    except cp.error.SolverError:
        return False
    return relaxed.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and relaxed.value is not None


def relaxation_in_background(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: float, mode: str,
                             time_limit: float) -> Future:
    """`lp_relaxation` started in a thread (HiGHS releases the GIL, so it uses a second core while
    the caller searches); read it with `relaxation_result`."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="monet-lp")
    future = pool.submit(lp_relaxation, graph, mem, recompute_s, budget, mode, max(1.0, time_limit))
    pool.shutdown(wait=False)
    return future


def relaxation_result(future: Future, deadline: float, grace: float = 2.0):
    """The result of `relaxation_in_background`, waiting until ``deadline`` (a `time.perf_counter`
    value) at most (``grace`` seconds after it, for the LP's own time limit to stop it): (None,
    None, None) if it has no answer by then."""
    try:
        return future.result(timeout=max(0.0, deadline - time.perf_counter()) + grace)
    except FutureTimeout:
        return None, None, None


def plain_solve(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: float, mode: str,
                solver: str, time_limit: float, constant_s: float = 0.0) -> dict:
    """MONeT's formulation as written, for contrast: no pruned variables, no LP relaxation, no
    start, the solver called through cvxpy.  Returns sizes, times (s), objective and bound
    (seconds, with ``constant_s``; None where the solver gave none) and cvxpy's status."""
    P = Problem(graph, mem, recompute_s, mode, prune=False)
    problem = cp.Problem(cp.Minimize(P.time_objective()),
                         P.cons + P.memory_constraints(float(budget) - 1e-6 * P.scale))
    run = _solve(problem, solver, time_limit, False, through_cvxpy=True)
    found = P.integral()
    obj = float(problem.value) + constant_s if found and problem.value is not None else None
    return dict(n_variables=sum(v.size for v in problem.variables()),
                n_constraints=sum(c.size for c in problem.constraints), build_s=P.build_time_s,
                solve_s=run.seconds, objective_s=obj,
                bound_s=obj if run.status == cp.OPTIMAL else None, status=str(run.status))


def problem_size(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, mode: str) -> tuple[int, int, float]:
    """(variables, constraint rows, build seconds) of the pruned ILP at a budget (`Problem`)."""
    P = Problem(graph, mem, recompute_s, mode)
    problem = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(1.0))
    return (sum(v.size for v in problem.variables()), sum(c.size for c in problem.constraints), P.build_time_s)


def _offload_s(mem: MemoryModel, S, R, O=None) -> float:
    """Seconds of exposed transfer of the offloaded groups O (G,), or of the schedule's effective
    ones (`solver.offload.OffloadModel.effective` of S (T, G), R (T, N)) when O is None; 0 without
    offload."""
    if mem.offload is None:
        return 0.0
    return mem.offload.cost(mem.offload.effective(S, R) if O is None else O)


def search(graph: OpGraph, mem: MemoryModel, allow_s: np.ndarray, recompute_s, budget: float | None,
           frac_s=None, deadline: float | None = None, iterate: bool = False, peak_of=None):
    """The cheapest schedule the search finds without a MIP solver: repaired candidates
    (`solver.repair.candidate_keeps`: roundings of the LP relaxation's ``frac_s`` and checkpoint
    sets), the block-level candidates of chains of identical blocks (`solver.structured`), and with
    a budget also `solver.repair.drop_greedily` and `solver.windows.drop_windows`, with PyTorch's
    implementations, whose ILP memory fits ``budget`` bytes (None: the one with the smallest peak).
    Until ``deadline`` (a `time.perf_counter` value) the fitting candidates are improved by
    `solver.repair.improve`: a descent from each, then (``iterate``) an iterated local search from
    the best.

    With ``peak_of`` (the simulator's peak of (S, R), `solver.simulated.simulated_peak_fn`), the
    block-level candidates whose ILP memory is over the budget by at most `NEAR_SLACK` are
    simulated too (the `NEAR_CHECKS` cheapest): the ILP's memory bounds the simulator's from above
    (it does not credit the executor's in-place ReLU and add), and where the simulator, which the
    executor's measured peak equals, fits one in the budget and it recomputes less than the
    search's schedule, it is taken (its ILP peak then exceeds the budget); and where the simulator
    puts the schedule below its ILP memory, part of the time (`SLACK_SHARE`; all of it when a
    simulated block-level candidate beats every one the ILP fits) searches that slack
    (`_improve_in_simulated_slack`).  At the peak
    transformers' per-block checkpointing measured on a 24-layer Llama, the ILP's memory put
    monet's per-block checkpointing 1.3 % over and the search paid +93 % instead of +19 %.

    Returns (S (T, G), R (T, N), recompute seconds, ILP peak bytes) or None.
    """
    # schedules of whole blocks on chains of identical blocks (`solver.structured`): per-block
    # checkpointing and its neighbours; then the repaired candidates in at most a fifth of the time
    # (on a 96-layer GPT-2 they took 35 s and fit worse)
    cands = [(c.S, c.R, c.peak, c.cost) for c in structured_candidates(graph, mem, recompute_s, allow_s, budget)]
    near = _simulated_fits(cands, budget, peak_of)
    share = None if deadline is None or not cands else time.perf_counter() + 0.2 * (deadline - time.perf_counter())
    cands += repaired_candidates(graph, mem, frac_s, allow_s, recompute_s, share)
    if budget is not None:
        cands = [c for c in cands if c[2] <= budget]
        # and two that drop values only where memory is short: the greedy
        # (`solver.repair.drop_greedily`) and the window knapsack (`solver.windows`), each in at
        # most a fifth of the time
        for make in (drop_greedily, drop_windows):
            share = None if deadline is None else time.perf_counter() + 0.2 * (deadline - time.perf_counter())
            found = make(graph, mem, allow_s, budget, recompute_s, share)
            if found is not None:
                cands.append((found[0], found[1], mem.peak(found[0], found[1]), found[2]))
        cands.sort(key=lambda c: c[3])
    if not cands and not near:
        return None
    if budget is None:
        S, R, peak, cost = min(cands, key=lambda c: c[2])
        return S, R, cost, peak
    # nothing the ILP's memory fits but a block-level schedule the simulator fits (a 96-layer
    # Llama at transformers' per-block peak: per-block checkpointing 0.3 % over by the ILP's count,
    # 0.1 % under by the simulator's): that schedule, and the slack search from it
    S, R, peak, cost = cands[0] if cands else near[0]
    # a descent from each candidate (cheapest first) in 40 % of the time, then an iterated
    # local search from the best (`solver.repair.improve`); where the simulator's peak of the best
    # sits below its ILP memory, both in 1 - SLACK_SHARE of the time and a search in that slack
    # (`_improve_in_simulated_slack`) in the rest
    # (when a block-level schedule the simulator fits is cheaper than every candidate the ILP's
    # memory fits, a 24-layer BERT's +43 % against +1,000 %, that slack gets all the time)
    share = 1.0 if not peak_of else 0.0 if near and (not cands or near[0][3] < cost) else 1.0 - SLACK_SHARE
    ends = None if deadline is None else time.perf_counter() + share * (deadline - time.perf_counter())
    first_phase = None if deadline is None else time.perf_counter() + (0.4 if iterate else 1.0) * (
        ends - time.perf_counter())
    for k, (S2, R2, _, _) in enumerate(cands):
        now = time.perf_counter()
        if deadline is None or now >= first_phase:
            break
        S2, R2, c2 = improve(graph, mem, S2, R2, budget, recompute_s, allow_s,
                             now + (first_phase - now) / (len(cands) - k))
        if c2 < cost:
            S, R, cost = S2, R2, c2
    slack = None
    if peak_of is not None and deadline is not None:
        base = (near[0][0], near[0][1]) if near and near[0][3] < cost else (S, R)
        slack = _simulated_slack(mem, *base, budget, peak_of)
        if slack[0] <= SLACK_MIN * budget or deadline - time.perf_counter() < 4 * slack[2]:
            slack, ends = None, deadline  # nothing to gain, or no time to simulate: all to the search
    if iterate and cands and deadline is not None and time.perf_counter() < ends:  # from a start the ILP fits
        S2, R2, c2 = improve(graph, mem, S, R, budget, recompute_s, allow_s, ends, rng=np.random.default_rng(0))
        if c2 < cost:
            S, R, cost, slack = S2, R2, c2, None if slack is None else _simulated_slack(mem, S2, R2, budget, peak_of)
    if near and near[0][3] < cost:
        S, R, _, cost = near[0]
    if slack is not None:
        S, R, cost = _improve_in_simulated_slack(graph, mem, S, R, cost, budget, recompute_s, allow_s, deadline,
                                                 peak_of, slack)
    return S, R, cost, mem.peak(S, R)


#: how far over the budget (a fraction) the ILP's memory of a block-level candidate may be for
#: `search` and `_no_costlier_than_known` to simulate it, and how many such candidates they simulate at most
#: (a 4-layer Llama's per-block checkpointing: 7 % over by the ILP's memory, under by the simulator's)
NEAR_SLACK, NEAR_CHECKS = 0.10, 3
#: the share of `search`'s time after its candidates spent searching in the simulator's slack, and
#: the smallest slack (a fraction of the budget) worth it
SLACK_SHARE, SLACK_MIN = 0.4, 0.001


def _simulated_slack(mem: MemoryModel, S, R, budget: float, peak_of) -> tuple[float, float, float]:
    """(bytes the ILP's memory of (S (T, G), R (T, N)) over-counts the simulator's peak, that
    simulated peak in bytes, seconds the simulation took)."""
    t0 = time.perf_counter()
    simulated = peak_of(S, R)
    return mem.peak(S, R) - simulated, simulated, time.perf_counter() - t0


def _improve_in_simulated_slack(graph: OpGraph, mem: MemoryModel, S, R, cost: float, budget: float, recompute_s,
                                allow_s, deadline: float, peak_of, slack: tuple | None = None):
    """``(S, R, seconds)``: the schedule (S (T, G), R (T, N)) that recomputes ``cost`` seconds, or
    a cheaper one that the simulator (``peak_of``) fits in ``budget`` bytes.

    The ILP's memory bounds the simulator's from above, by a few MiB on a deep transformer (it
    does not credit the executor's in-place ReLU and add, nor values freed inside a stage), and
    not by the same amount on every schedule.  So: a descent (`solver.repair.improve`) with the
    budget raised by what the ILP over-counts on the schedule (``slack``: its `_simulated_slack`,
    simulated when None), its moves recorded, then a bisection over them with the simulator for
    the last that fits; again from there while its own over-count and ``deadline`` (a
    `time.perf_counter` value) allow.  At the peak transformers' per-layer checkpointing measured
    on a 24-layer BERT, every schedule the ILP's memory fits recomputes over +1,000 %, the
    block-level per-layer checkpointing that the simulator fits (2.3 MiB over in the ILP's memory)
    +42.7 %, and this finds +35.4 % (halving the raise instead of the bisection landed 0.15 MiB
    over at every raise).
    """
    raise_by, simulated, sim_s = _simulated_slack(mem, S, R, budget, peak_of) if slack is None else slack
    if simulated > budget:  # cannot happen: every candidate fits one way or the other
        return S, R, cost
    while raise_by > SLACK_MIN * budget and deadline - time.perf_counter() > 4 * sim_s:
        moves: list = []
        until = time.perf_counter() + 0.5 * (deadline - time.perf_counter() - 2 * sim_s)
        improve(graph, mem, S, R, budget + raise_by, recompute_s, allow_s, until, trail=moves)
        lo, hi, fits_at = 0, len(moves) + 1, simulated  # after `lo` moves it fits, after `hi` not
        probe = len(moves)  # all of them first
        while hi - lo > 1 and deadline - time.perf_counter() > 1.5 * sim_s:
            peak = peak_of(*replay(S, R, moves[:probe]))
            if peak <= budget:
                lo, fits_at = probe, peak
            else:
                hi = probe
            probe = (lo + hi) // 2
        if lo == 0:
            break
        S, R = replay(S, R, moves[:lo])
        cost, simulated = moves[lo - 1].cost, fits_at
        raise_by = mem.peak(S, R) - simulated
    return S, R, cost


def _simulated_fits(cands: list, budget: float | None, peak_of) -> list:
    """Of ``cands`` ((S, R, ILP peak, seconds)), those over ``budget`` by the ILP's memory by at most
    `NEAR_SLACK` that ``peak_of`` fits in it, cheapest first (at most `NEAR_CHECKS` simulated)."""
    if budget is None or peak_of is None:
        return []
    over = sorted((c for c in cands if budget < c[2] <= (1.0 + NEAR_SLACK) * budget), key=lambda c: c[3])
    return [c for c in over[:NEAR_CHECKS] if peak_of(c[0], c[1]) <= budget]


def _start(P: Problem, graph: OpGraph, mem: MemoryModel, recompute_s, budget: float | None, frac_s=None,
           deadline: float | None = None, iterate: bool = False):
    """A MIP start: the schedule of `search` as values of ``P``'s variables.

    Returns ({variable: values}, recompute seconds, ILP peak bytes, S (T, G), R (T, N)) or None.
    A start gives CBC an incumbent before its first LP, so a solve stopped early still has a
    schedule and a gap.
    """
    found = search(graph, mem, P.allow_s, recompute_s, budget, frac_s, deadline, iterate)
    if found is None:
        return None
    S, R, cost, peak = found
    start = {}
    if P.s is not None:
        start[P.s] = S.ravel()[P.s_idx]
    if P.r is not None:
        start[P.r] = R.ravel()[P.r_idx]
    if P.m is not None:
        start[P.m] = mem.default_options()
    if P.o is not None:  # the allowed groups the schedule keeps through their windows (its peak's)
        start[P.o] = mem.offload.effective(S, R)[P.o_idx].astype(float)
    return start, cost, peak, S, R


def huge_allow_s(graph: OpGraph, mem: MemoryModel, mode: str) -> np.ndarray | None:
    """``allow_s`` of `allowed` when the ILP would have more than `HUGE` R and S variables in
    recompute-or-store mode (no implementation options, no offload), else None: the cue for the
    search alone."""
    if mode != "normal" or mem.n_options or mem.offload is not None:
        return None
    _, allow_r, allow_s = allowed(graph, mem, mode)
    return allow_s if int(allow_r.sum()) + int(allow_s.sum()) > HUGE else None


def _search_only(graph: OpGraph, mem: MemoryModel, allow_s: np.ndarray, recompute_s, budget: int, mode: str,
                 solver: str, time_limit: float, constant_s: float, peak_of, progress, smallest: bool,
                 t0: float) -> ILPResult:
    """`solve_ilp` above `HUGE` variables: `search`'s schedule in the whole limit (iterated), status
    ``heuristic``, no bound.  Raises `InfeasibleBudgetError` as `solve_ilp` does."""
    n_vars = int(allowed(graph, mem, mode)[1].sum() + allow_s.sum())
    found = search(graph, mem, allow_s, recompute_s, float(budget), None, t0 + time_limit - 1.0, iterate=True,
                   peak_of=peak_of)
    if found is not None and peak_of is not None and peak_of(found[0], found[1]) > budget:
        found = None  # cannot happen: the ILP's memory bounds the simulator's
    if found is None:
        if not smallest:
            raise InfeasibleBudgetError(int(budget), None, mode)
        least, _, S, R, _, _ = solve_min_budget(graph, mem, mode, solver, max(1.0, t0 + time_limit - time.perf_counter()),
                                                peak_of=peak_of)
        if least > budget:
            raise InfeasibleBudgetError(int(budget), least, mode, exact=False)
        found = (S, R, float(np.asarray(recompute_s, dtype=float) @ R.sum(axis=0)), least)
    S, R, cost, _ = found
    if progress is not None:
        progress(f"  {n_vars} variables: no LP or MIP solver at this size, the search's schedule stands "
                 f"({cost + constant_s:.6g} s)")
    return ILPResult(S=mem.group_to_node(S), R=R, objective_s=cost + constant_s, bound_s=None, gap=None,
                     status="heuristic", solve_time_s=time.perf_counter() - t0, build_time_s=0.0, n_variables=n_vars,
                     n_constraints=0, solver="search", history=[])


def solve_min_budget(graph: OpGraph, mem: MemoryModel, mode: str = "normal", solver: str = "CBC",
                     time_limit: float = 60.0, verbose: bool = False, peak_of=None, progress=None):
    """Smallest budget (bytes) for which a schedule exists in ``mode``, and that schedule.

    Bounds it from below by the LP relaxation (`min_budget_relaxation`, on up to 30 % of the
    limit), solves ``min budget`` subject to the ILP's constraints (started from the smallest
    repaired checkpoint schedule) below `LARGE` variables, then compares its schedule with the
    repaired candidates of `monet.solver.repair` (roundings of the relaxations) by
    ``peak_of(S, R[, M])`` (the simulator's exact peak when given; else the ILP's expression, an
    upper bound).  Returns (bytes, proven, S (T, G), R (T, N), M (O,) or None for PyTorch's
    implementations, the LP's lower bound in bytes or None): ``proven`` when the solver proved
    its optimum and nothing beat it, or when the schedule's peak is at the LP bound or below.
    """
    t0 = time.perf_counter()
    in_model = peak_of is None  # peaks in the ILP's own memory: its optimum is proven
    peak_of = peak_of or mem.peak
    allow_s = huge_allow_s(graph, mem, mode)
    if allow_s is not None:  # no cvxpy problem at this size: the smallest of the search's candidates
        peak, S, R = smallest_candidate(graph, mem, None, allow_s, peak_of, deadline=t0 + time_limit)
        found = search(graph, mem, allow_s, np.zeros(len(graph.fwd)), None, deadline=t0 + time_limit)
        if found is not None and peak_of(found[0], found[1]) < peak:
            S, R = found[0], found[1]
            peak = peak_of(S, R)
        return int(np.ceil(peak)), False, S, R, None, None
    lower, frac_lp = min_budget_relaxation(graph, mem, mode, 0.3 * time_limit)
    P = Problem(graph, mem, np.zeros(len(graph.fwd)), mode)
    b = P.budget_var  # in units of P.scale bytes
    problem = cp.Problem(cp.Minimize(b), P.cons + P.memory_constraints(b))
    start = _start(P, graph, mem, np.zeros(len(graph.fwd)), None)
    if start is not None:
        start[0][b] = np.array([start[2] / P.scale])
    if sum(v.size for v in problem.variables()) > LARGE:
        # no MIP solver at this size (see LARGE): the smallest repaired candidate (the narrow
        # ResNet-50 of the test suite spent 250 s here with HiGHS and 4 s limits)
        run = _Run(cp.USER_LIMIT, None, 0.0, [])
    else:
        run = _solve(problem, solver, max(1.0, t0 + time_limit - time.perf_counter()), verbose,
                     start=None if start is None else start[0], gap_abs=1e-4, progress=progress)
    # repaired candidates use PyTorch's implementations (M = None)
    frac = P.fractional_s()
    peak, S, R = smallest_candidate(graph, mem, frac_lp if frac is None else frac, P.allow_s, peak_of,
                                    deadline=t0 + time_limit)
    best, proven = (peak, S, R, None), False
    if P.integral():
        S, R, M = *P.matrices(), P.chosen_options()
        peak = peak_of(S, R) if M is None else peak_of(S, R, M)
        if peak <= best[0]:
            # (not `peak_of is mem.peak`: each access makes a new bound method)
            best, proven = (peak, S, R, M), run.status == cp.OPTIMAL and in_model
    peak, S, R, M = best
    proven = proven or (lower is not None and peak <= lower)
    return int(np.ceil(peak)), proven, S, R, M, lower


@dataclass
class _Relaxed:
    """The LP relaxation of a `solve_ilp`: its bound (model units: seconds of recomputation, less
    the constant time; None when not solved, or not in time), the fractional S (T, G) and M (O,)
    it found (roundings for the MIP start and the repair fallback), and, at full scale, the
    thread it runs in."""

    lp: float | None = None
    frac_s: np.ndarray | None = None
    frac_m: np.ndarray | None = None
    background: Future | None = None


def _relax(graph: OpGraph, mem: MemoryModel, recompute_s, limit: float, mode: str, time_limit: float,
           large: bool) -> _Relaxed:
    """The LP relaxation: a bound, and roundings for the MIP start and for the repair fallback.  At
    full scale (``large``) it runs in a thread next to the local search (12-27 s on ResNet-50 at
    batch 184, 91,000 columns), and its roundings are not used (the search beat them): `_collect`
    takes its bound; below, it may use all of the limit but 1 s."""
    if large:
        return _Relaxed(background=relaxation_in_background(graph, mem, recompute_s, limit, mode, time_limit - 5.0))
    return _Relaxed(*lp_relaxation(graph, mem, recompute_s, limit, mode, max(1.0, time_limit - 1.0)))


def _collect(relaxed: _Relaxed, deadline: float) -> bool:
    """Take the bound of a relaxation run in the background (`_relax`), waited for until
    ``deadline`` (`time.perf_counter` seconds); False where there is none to wait for."""
    if relaxed.background is None:
        return False
    relaxed.lp, _, _ = relaxation_result(relaxed.background, deadline)
    return True


def _show_relaxation(progress, lp: float | None, constant_s: float, t0: float, waited: bool) -> None:
    """The progress line of the LP relaxation: its bound (seconds, ``constant_s`` included), or,
    for one ``waited`` for in the background, that it had no answer in time."""
    if progress is not None and (lp is not None or waited):
        text = "no answer in time" if lp is None else f"bound {lp + constant_s:.6g} s"
        progress(f"  LP relaxation: {text} ({time.perf_counter() - t0:.1f} s)")


def _polish_until(t0: float, time_limit: float, large: bool) -> float:
    """When the local search's improvement of the start stops (`time.perf_counter` seconds).

    It runs until a fifth of the limit (at least 2 s) is left for CBC: at full scale (more than
    `LARGE` variables, an iterated search) CBC finds no better schedule, so the improved start is
    the answer; on small graphs the descent ends at once and CBC proves the optimum.  And it gets
    at least a quarter of the limit, even when the LP relaxation took all of it (the demo's
    ResNet-50 under load: its schedule was then an unimproved checkpoint set, +63 %)."""
    return max(t0 + time_limit - (1.5 if large else max(2.0, 0.2 * time_limit)),
               time.perf_counter() + 0.25 * time_limit)


def _mip(problem: cp.Problem, start, large: bool, n_vars: int, solver: str, time_limit: float, verbose: bool,
         gap_abs: float, progress, constant_s: float, shown_start: float | None) -> _Run:
    """CBC (or ``solver``) from ``start`` (`_start`'s answer or None) in ``time_limit`` seconds.

    Not run above `LARGE` variables: CBC did not answer within a minute at that size (ResNet-50 at
    batch 184, 60,000-91,000 variables: preprocessing alone outlasted every share of the limit), so
    the local search's schedule stands, with the LP relaxation's bound; without one (nothing
    repaired fits: GPT-2 below 52 % of its plain peak, where CBC ran 6-24 s for nothing), the repair
    fallback and the smallest-budget search answer (`_fallback`).  ``shown_start``: the start's
    objective as the progress line shows it (seconds)."""
    if large:
        if progress is not None and shown_start is not None:
            progress(f"  {n_vars} variables: {solver.upper()} skipped, the local search's schedule stands "
                     f"({shown_start:.6g} s)")
        return _Run(cp.USER_LIMIT, None, 0.0, [])
    return _solve(problem, solver, time_limit, verbose, start=None if start is None else start[0],
                  gap_abs=gap_abs, progress=progress, shown_offset=constant_s)


@dataclass
class _Chosen:
    """The schedule `solve_ilp` returns: S (T, G) kept groups, R (T, N) recomputations, M (O,) the
    chosen implementation options (None without options), O (G,) offloaded groups (None: the
    schedule's effective ones), how it was found beyond the solver (``"+repair"``, ``"+start"``)
    and whether it is a heuristic's (no proof from the solver)."""

    S: np.ndarray
    R: np.ndarray
    M: np.ndarray | None = None
    O: np.ndarray | None = None
    via: str = ""
    heuristic: bool = False


def _from_solver(P: Problem, graph: OpGraph, mem: MemoryModel, frac_s, recompute_s, budget: int,
                 peak_of) -> _Chosen | None:
    """The solver's integer schedule, if it has one the simulator (``peak_of``) fits in ``budget``
    (the ILP's memory bounds the simulator's, tested, but a schedule is only returned once the
    simulator agrees); replaced by a repaired rounding of the LP relaxation (``frac_s``) that the
    simulator fits and that recomputes less (the ILP's memory, an upper bound, may have rejected it).
    None without one."""
    if not P.integral():
        return None
    S, R = P.matrices()
    M, O = P.chosen_options(), P.chosen_offload()
    with_o = {} if O is None else {"O": O}
    if peak_of is not None and (peak_of(S, R, **with_o) if M is None else peak_of(S, R, M, **with_o)) > budget:
        return None
    if M is not None:
        return _Chosen(S, R, M, O)
    alt = round_and_repair(graph, mem, frac_s, P.allow_s, float(budget), recompute_s, peak_of or mem.peak)
    if alt is not None and (alt[2] + _offload_s(mem, alt[0], alt[1])
                            < float(np.asarray(recompute_s, dtype=float) @ R.sum(axis=0))
                            + _offload_s(mem, S, R, O) - 1e-12):
        return _Chosen(alt[0], alt[1], via="+repair", heuristic=True)
    return _Chosen(S, R, None, O)


def _fallback(P: Problem, graph: OpGraph, mem: MemoryModel, start, frac_s, recompute_s, budget: int,
              mode: str, solver: str, time_limit: float, verbose: bool, peak_of, smallest: bool,
              large: bool) -> _Chosen | None:
    """A schedule where the solver has no integer one that fits: infeasible for the ILP's
    (pessimistic) memory, or stopped by its time limit.  With implementation options: the improved
    start with PyTorch's implementations, else None (the caller, `solver.portfolio.solve_full`,
    fixes the implementations and repairs).  Without: the cheapest of the repaired roundings of
    the LP relaxation (`solver.repair`) whose simulated peak fits and the improved start, else the
    smallest-budget schedule.

    Raises:
        InfeasibleBudgetError: nothing fits (the smallest feasible budget named when ``smallest``).
    """
    if mem.n_options:
        if start is None:
            return None
        return _Chosen(start[3], start[4], mem.default_options() > 0.5, via="+start", heuristic=True)
    # at full scale the start's search saw these candidates already (by the ILP's memory) and took
    # all of the limit: simulating them again took 12 s past it on a 24-layer GPT-2
    best = (None if large and start is not None else
            round_and_repair(graph, mem, frac_s, P.allow_s, float(budget), recompute_s, peak_of or mem.peak))
    if start is not None and (best is None or start[1] < best[2]):  # the improved start
        best = (start[3], start[4], start[1])
    if best is None and not smallest:
        raise InfeasibleBudgetError(int(budget), None, mode)
    if best is None:
        least, proven, S_min, R_min, _, lower = solve_min_budget(graph, mem, mode, solver, time_limit, verbose, peak_of)
        if least > budget:
            raise InfeasibleBudgetError(int(budget), least, mode, exact=proven, lower_bytes=lower)
        best = (S_min, R_min, None)
    return _Chosen(best[0], best[1], via="+repair", heuristic=True)


def _no_costlier_than_known(graph: OpGraph, mem: MemoryModel, recompute_s, allow_s: np.ndarray, budget: int,
                            peak_of, chosen: _Chosen, start) -> _Chosen:
    """The cheapest of ``chosen``, the MIP start (`_start`'s tuple, or None) and the block-level
    schedules (`solver.structured`) that the ILP's memory puts over ``budget`` by at most
    `NEAR_SLACK` (`_simulated_fits`), of those the simulator (``peak_of``) fits in ``budget`` bytes.

    A solver stopped by its time limit may return an incumbent costlier than its start (or none,
    and a repaired rounding stands), and the ILP's memory bounds the simulator's from above, so
    per-block checkpointing at its own simulated peak can lie outside the ILP's feasible set: so
    that the answer never recomputes more than the schedules the search knows, whatever the time
    limit (docs/design.md, "Deep networks").  Recompute-or-store only: with implementation
    options or offload ``chosen`` is returned as it is."""
    if peak_of is None or mem.n_options or mem.offload is not None or chosen.M is not None:
        return chosen
    best, cost = chosen, float(np.asarray(recompute_s, dtype=float) @ chosen.R.sum(axis=0))
    if start is not None and start[1] < cost and peak_of(start[3], start[4]) <= budget:
        best, cost = _Chosen(start[3], start[4], via="+start", heuristic=True), start[1]
    cands = [(c.S, c.R, c.peak, c.cost) for c in structured_candidates(graph, mem, recompute_s, allow_s, budget)]
    near = _simulated_fits(cands, float(budget), peak_of)
    if near and near[0][3] < cost:
        best = _Chosen(near[0][0], near[0][1], via="+blocks", heuristic=True)
    return best


def _no_integer(P: Problem, run: _Run, relaxed: _Relaxed, constant_s: float, solver: str, n_vars: int,
                n_cons: int) -> ILPResult:
    """The answer with implementation options and no integer schedule: the implementations the LP
    relaxation leans to (CBC's values when it has some), and the bound (the LP relaxation's or
    CBC's), which still bounds the joint problem for the caller (`solver.portfolio.solve_full`)."""
    frac = (relaxed.frac_m if P.m is None or P.m.value is None
            else np.clip(np.asarray(P.m.value, dtype=float), 0, 1))
    bound = None if run.bound is None else run.bound + constant_s
    return ILPResult(S=None, R=None, objective_s=float("nan"), bound_s=bound, gap=None, status="no_integer",
                     solve_time_s=run.seconds, build_time_s=P.build_time_s, n_variables=int(n_vars),
                     n_constraints=int(n_cons), solver=solver.upper(), M=frac, history=run.history)


def _offloads(mem: MemoryModel, chosen: _Chosen, budget: int, time_limit: float) -> np.ndarray | None:
    """The groups ``chosen`` offloads: the ILP's, or for a heuristic's schedule its effective ones,
    less those the budget does not need (in the ILP's memory, which bounds the simulator's)."""
    if mem.offload is None or chosen.O is not None:
        return chosen.O
    S, R = chosen.S, chosen.R
    O = mem.offload.effective(S, R)
    return mem.offload.trimmed(O, lambda O2: mem.peak(S, R, O=O2) <= budget,
                               time.perf_counter() + max(1.0, 0.05 * time_limit))


def _objective_s(P: Problem, problem: cp.Problem, mem: MemoryModel, chosen: _Chosen, start, recompute_s,
                 constant_s: float) -> float:
    """Seconds of ``chosen``: its recomputation (and offload) time, its implementations' time where
    it has options (the start's: its recomputation plus PyTorch's implementations; the solver's: the
    ILP's objective), plus ``constant_s``."""
    if chosen.M is not None and chosen.heuristic:
        return start[1] + float(P.opt_time @ chosen.M) + constant_s
    if chosen.M is not None:
        return float(problem.value) + constant_s
    return (float(np.asarray(recompute_s, dtype=float) @ chosen.R.sum(axis=0)) + constant_s
            + _offload_s(mem, None, chosen.R, chosen.O))


def _proof(obj: float, status: str, run_bound: float | None, constant_s: float, gap: float) -> tuple:
    """(bound s, gap found, `ILPResult.status`) of a schedule of ``obj`` seconds: proven optimal,
    within ``gap``, stopped by the time limit, or a heuristic's (``status`` the solver's, or
    ``"heuristic"``; ``run_bound`` the solver's or the LP relaxation's bound, model units)."""
    optimal = status == cp.OPTIMAL
    if optimal:
        return obj, 0.0, "optimal"
    bound = None if run_bound is None else run_bound + constant_s
    found = None if bound is None else max(0.0, (obj - bound) / obj) if obj > 0 else 0.0
    if status == "heuristic":
        return bound, found, "heuristic"
    return bound, found, "gap" if found is not None and found <= gap else "time_limit"


def solve_ilp(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: int, mode: str = "normal",
              solver: str = "CBC", time_limit: float = 60.0, constant_s: float = 0.0,
              verbose: bool = False, peak_of=None, gap: float = 0.0, progress=None,
              relaxation: bool = True, smallest: bool = True) -> ILPResult:
    """Minimise recomputation time under a memory budget (bytes).

    The solve is started from the cheapest repaired checkpoint schedule whose ILP memory fits
    (`_start`), so a solve stopped by its time limit returns at least that schedule, with its gap.
    In order: the LP relaxation (`_relax`), the start improved by local search (`_start`, until
    `_polish_until`), the MIP solver (`_mip`), the schedule (`_from_solver`, else `_fallback`),
    its offloads (`_offloads`), its seconds and proof (`_objective_s`, `_proof`).

    Args:
        recompute_s: (N,) seconds to recompute each forward node.
        budget: bytes; the ILP's memory expressions (an upper bound of the executor's) must fit.
        mode: "normal" (recompute or store), "none" (keep everything: plain PyTorch) or a mode
            with implementation choices (``mem`` then carries the options).
        solver: "CBC" (default), "HIGHS" or "SCIP".
        time_limit: seconds (wall clock); the best schedule found by then is returned with its gap.
        constant_s: forward + backward time added to the objective (seconds).
        gap: stop once the schedule is proven within this fraction of the best bound (the
            objective counts ``constant_s``); 0 solves to optimality.
        progress: ``progress(str)``: the incumbent and the bound as the solve goes (CBC).
        relaxation: solve the LP relaxation first (a bound, and roundings that start the search).
            Without it, the search starts from the checkpoint schedules alone and has the LP's
            time: `solver.portfolio.solve_full` takes its bound from the joint ILP and skips it for
            its fixed-implementation solves at full scale, where the search beat the roundings
            (see `solver.repair.improve`) and the LP took 8-25 s of a 60 s limit.
        peak_of: ``peak_of(S (T, G), R (T, N)) -> bytes``, the simulator's exact peak of a schedule.
            When the ILP (whose memory is an upper bound) finds nothing, repaired candidates and the
            smallest-budget schedule are accepted if this peak fits the budget (status "heuristic").
        smallest: when nothing fits, search the smallest budget (`solve_min_budget`) for the error
            and for a schedule the simulator fits; `solver.portfolio.solve_full` searches once itself.

    Raises:
        InfeasibleBudgetError: no schedule fits; names the smallest feasible budget (None
            without ``smallest``).
        RuntimeError: the solver found no schedule within the time limit.
    """
    t0 = time.perf_counter()
    allow_s = huge_allow_s(graph, mem, mode)
    if allow_s is not None:
        return _search_only(graph, mem, allow_s, recompute_s, budget, mode, solver, time_limit, constant_s,
                            peak_of, progress, smallest, t0)
    P = Problem(graph, mem, recompute_s, mode)
    # 1e-6 below the budget: solvers accept violations up to their tolerance
    limit = float(budget) - 1e-6 * P.scale
    problem = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(limit))
    n_vars = sum(v.size for v in problem.variables())
    n_cons = sum(c.size for c in problem.constraints)
    large = n_vars > LARGE  # see LARGE

    relaxed = _relax(graph, mem, recompute_s, limit, mode, time_limit, large) \
        if mode != "none" and relaxation else _Relaxed()
    _show_relaxation(progress, relaxed.lp, constant_s, t0, waited=False)
    # the search checks its candidates exactly: at the budget itself (per-block checkpointing at its
    # own peak is one), not at the solver's tolerance below it
    start = (_start(P, graph, mem, recompute_s, float(budget), relaxed.frac_s, _polish_until(t0, time_limit, large),
                    iterate=large) if mode != "none" else None)
    if _collect(relaxed, t0 + time_limit):
        _show_relaxation(progress, relaxed.lp, constant_s, t0, waited=True)
    shown_start = (None if start is None else
                   start[1] + constant_s + (float(P.opt_time @ mem.default_options()) if mem.n_options else 0.0))
    run = _mip(problem, start, large, n_vars, solver, max(1.0, time_limit - (time.perf_counter() - t0)), verbose,
               gap * constant_s, progress, constant_s, shown_start)
    if relaxed.lp is not None and (run.bound is None or run.bound < relaxed.lp):
        run.bound = relaxed.lp
    chosen = _from_solver(P, graph, mem, relaxed.frac_s, recompute_s, budget, peak_of)
    if chosen is None:
        chosen = _fallback(P, graph, mem, start, relaxed.frac_s, recompute_s, budget, mode, solver, time_limit,
                           verbose, peak_of, smallest, large)
        if chosen is None:
            return _no_integer(P, run, relaxed, constant_s, solver, n_vars, n_cons)
    chosen = _no_costlier_than_known(graph, mem, recompute_s, P.allow_s, budget, peak_of, chosen, start)
    if mode == "none":
        chosen.S = chosen.S | P.allow_s
    chosen.O = _offloads(mem, chosen, budget, time_limit)
    obj = _objective_s(P, problem, mem, chosen, start, recompute_s, constant_s)
    bound, gap_found, kind = _proof(obj, "heuristic" if chosen.heuristic else run.status, run.bound, constant_s, gap)
    return ILPResult(S=mem.group_to_node(chosen.S), R=chosen.R, M=chosen.M, O=chosen.O, objective_s=obj,
                     bound_s=bound, gap=gap_found, status=kind, solve_time_s=run.seconds,
                     build_time_s=P.build_time_s, n_variables=int(n_vars), n_constraints=int(n_cons),
                     solver=solver.upper() + chosen.via, history=run.history)
