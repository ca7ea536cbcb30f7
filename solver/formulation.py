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
against the unpruned formulation, `monet.solver.ilp.plain_solve`).  The constraint matrices are
built as sparse matrices from index arrays; only the per-recomputation rows loop over stages.
"""
from __future__ import annotations

import time

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from monet.solver.memory_model import KEEP, KEEP_NEXT, LIVE, RECOMPUTE, MemoryModel


# Above this many variables CBC found no schedule better than its start within a minute on 2
# cores (ResNet-50 at batch 184: 91,000), so the time goes to the local search instead; HiGHS's
# presolve alone outlasted the test suite's 4 s limits there, so the rule holds for every solver
LARGE = 20000
# Above this many R and S variables not even the LP relaxation answers within a minute on 2 cores
# (a 12-layer GPT-2: 178,000 of them, 287,000 variables in all: no answer in 14 s; a 48-layer one
# held 7 GB building it), so no cvxpy problem is built at all: the search (`search`) alone gives
# the schedule, with no bound.  ResNet-50 at batch 184 (at most 204,000 variables in all) is below
HUGE = 150_000


def allowed(mem: MemoryModel, mode: str = "normal", prune: bool = True):
    """Where the ILP has variables: (reads (T, G) bool: backward node t reads group g under some
    option; allow_r (T, N): node i may be recomputed in stage t, an ancestor of what the stage
    reads (none in mode "none"); allow_s (T, G): group g may be kept at the start of stage t, some
    stage from t on may need it).  Without ``prune``, MONeT's formulation as written: R and S
    everywhere.  The repairs and the greedy of `solver.repair` take ``allow_s``."""
    N, T, G = mem.n_fwd, mem.n_bwd, len(mem.groups)
    gnode = mem.group_node
    anc = mem.ancestors
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

    def __init__(self, mem: MemoryModel, recompute_s: np.ndarray, mode: str, relax: bool = False,
                 prune: bool = True, recompute_rows: bool = True):
        t0 = time.perf_counter()
        self.mem = mem
        N, T, G, O = mem.n_fwd, mem.n_bwd, len(mem.groups), mem.n_options
        self.N, self.T, self.G, self.O, self.mode = N, T, G, O, mode
        self.reads, self.allow_r, self.allow_s = allowed(mem, mode, prune)
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
        mem, T, N, scale = self.mem, self.T, self.N, self.scale
        row_t, row_i, link, lam, ws_rows, n_rows, n_lam = self._recompute_events(held)
        if not n_rows:
            return
        row_t, row_i = np.array(row_t), np.array(row_i)
        Y = cp.Variable(n_rows, nonneg=True, name="Y")
        last = np.ones(n_rows, dtype=bool)
        last[:-1] = row_t[1:] != row_t[:-1]
        L = cp.Variable(n_lam, nonneg=True, name="L") if n_lam else None
        if n_lam:
            self._liveness_rows(L, lam)
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
            expr = expr + self._recompute_workspace(ws_rows, n_rows)
        self.bwd_rows.append(expr)

    def _recompute_events(self, held):
        """Per stage t, the rows of its recomputable nodes and the `StageEvents` between them: (row
        stage, row node, event links (row, kind, column, coefficient), liveness groups (stage,
        index, reader, group, last), rows of choice nodes with a workspace, rows, liveness vars)."""
        mem, T, N, G = self.mem, self.T, self.N, self.G
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
        return row_t, row_i, link, lam, ws_rows, n_rows, n_lam

    def _liveness_rows(self, L, lam) -> None:
        """L[l] >= R[t, reader], L[l] >= L[l + 1] within a group, and the group's last L[l] >=
        S[t + 1, group] (`StageEvents`)."""
        T, N, G, sel = self.T, self.N, self.G, self.sel
        lt, li, lk, lg, ll = (np.concatenate(x) for x in zip(*lam))
        self.cons.append(L[li] >= sel(lt * N + lk, self.TN) @ self.Rf)
        more = np.flatnonzero(~ll)
        if len(more):
            self.cons.append(L[li[more]] >= L[li[more] + 1])
        fin = np.flatnonzero(ll & (lt + 1 < T))
        if len(fin):
            self.cons.append(L[li[fin]] >= sel((lt[fin] + 1) * G + lg[fin], self.TG) @ self.Sf)

    def _recompute_workspace(self, ws_rows, n_rows: int):
        """The workspace rows add: a choice node's workspace under its chosen option, Wr >= ws_o
        (R[t, i] + M[o] - 1), one Wr per (row, stage, node) of ``ws_rows``."""
        N, scale, sel = self.N, self.scale, self.sel
        Wr = cp.Variable(len(ws_rows), nonneg=True, name="Wr")
        wr_i = np.array([i for _, _, i in ws_rows])
        wr_t = np.array([t for _, t, _ in ws_rows])
        for i, o, w in self.mem.rec_ws:
            k = np.flatnonzero(wr_i == i)
            if len(k):
                self.cons.append(Wr[k] >= (w / scale) * (sel(wr_t[k] * N + i, self.TN) @ self.Rf + self.Mv[o] - 1))
        return sp.csr_matrix((np.ones(len(ws_rows)), ([r for r, _, _ in ws_rows], np.arange(len(ws_rows)))),
                             shape=(n_rows, len(ws_rows))) @ Wr

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
