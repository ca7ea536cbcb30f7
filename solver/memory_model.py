"""The memory terms of the ILP, as arrays (MONeT, Shah et al. ICLR 2021, Sec. 4 "memory constraints").

All quantities are bytes.  With N forward nodes, T backward stages, G kept-value groups and O
implementation options:

* **Groups.**  One group per forward value that something reads after its producer ran (a
  kept-or-recomputed candidate); S is indexed by group, so keeping BatchNorm's batch statistics
  does not count its output.  A value that exists only under one implementation of its node (a
  1-bit ReLU mask, compact max-pool offsets) is a group of its own, tied to that option.
* **Options.**  A node with several implementations (`monet.impls`) is a *choice*; its options
  are one-hot variables M.  An option changes the node's outputs (new compact values), its
  workspace and time, and what its backward nodes (the *governed* ones) read and allocate.  The
  numbers come from variant graphs in which the implementation is applied (`solver.choices`).
* **Forward pass** (stage 0 of the paper, every node computed in order).  While forward node k runs,
  the live bytes are: the constants, the values produced before k that a later forward node or a
  forward output still reads, the values of kept groups that nothing in the forward reads any
  more, and node k's outputs and workspace.  This is exact: the executor frees a value after its
  last use unless it is kept.  Written ``fwd_const[k] + fwd_keep[k] @ S[0] + fwd_opt[k] @ M``.
* **Backward stage t.**  Stage t recomputes its nodes in forward order, then runs backward node t.
  The bytes live throughout the stage are ``U[t]``: the constants, the caller's outputs, the
  backward values live at the start of the stage (``bwd_live[t]``, gradients: independent of the
  schedule; under implementation options ``live_opt @ M`` corrects them for what the variant
  graphs hold instead) and the generator states of recomputed random nodes.  The forward values
  (kept groups S, recomputed nodes R) count where the executor holds them, which frees a value
  after its last use:

  - *while backward node t runs*: the groups it reads, kept (``S[t]``) or recomputed
    (``bwd_read_bytes[t] @ R[t]``: the values of a recomputed node that it reads, not all of the
    node's outputs), the other groups only if they are kept into stage t + 1 (``S[t + 1]``), plus
    its outputs and workspace (``bwd_extra[t] + bwd_opt[t] @ M``): `MemoryModel.kept_at_backward`;
  - *while recomputing node i* (one row per recomputed node, as MONeT's per-operator rows): its
    outputs and workspace; a group of a node after i if kept; a group of a node before i (kept or
    recomputed) if backward node t reads it, or if it is kept into stage t + 1 or a forward node
    from i on that the stage recomputes reads it (``L = max(S[t + 1, g], R[t, k])``, linear with
    one helper variable per (group, reader)): `MemoryModel.stage_events`.

  This equals the simulator (`monet.simulate`) on schedules that keep nothing they do not read,
  but for the generator states (counted in every stage, where the executor frees each after its
  last recomputation: 5,056 bytes a random node on the CPU, a 512-byte block on a CUDA graph:
  `monet.solver.memory_build.rng_state_bytes`), and bounds it from above on any schedule (a group kept where no
  recomputation or backward node reads it, and one recomputed in a stage for a later one, count
  from the stage's start), so a schedule that satisfies it fits the budget (tested in
  tests/test_memory_model.py, and on CUDA graphs in tests/test_cuda_memory.py).

The arrays are built from a graph by `monet.solver.memory_build.build_memory_model`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from monet.graph import OpGraph


@dataclass
class Option:
    """One implementation option of a choice (see the module docstring).

    Attributes:
        choice: index of its choice; ``key`` the node (``"fwd:<id>"``/``"bwd:<id>"``); ``impl`` the
            implementation name (``"default"`` = PyTorch's).
        graph: the graph in which the option is applied (the base graph for ``"default"``).
        node: the forward node id of a forward choice, -1 for a backward-only choice.
        governed: backward node ids whose reads, outputs or workspace depend on the option.
        fwd_workspace, bwd_workspace: (N,), (T,) bytes of temporaries in ``graph``.
        fwd_time, fwd_recompute, bwd_time: (N,), (N,), (T,) seconds in ``graph``.
    """

    choice: int
    key: str
    impl: str
    graph: OpGraph
    node: int
    governed: tuple[int, ...]
    fwd_workspace: np.ndarray
    bwd_workspace: np.ndarray
    fwd_time: np.ndarray
    fwd_recompute: np.ndarray
    bwd_time: np.ndarray


# kinds of variable a `StageEvents` term multiplies, in stage t
KEEP, KEEP_NEXT, RECOMPUTE, LIVE = 0, 1, 2, 3  # S[t, g], S[t + 1, g], R[t, j], L[t, g, reader]


@dataclass
class StageEvents:
    """What is live in one backward stage t while forward nodes recompute, as linear terms: the
    ILP's form of `MemoryModel.live_while_recomputing` (built by `MemoryModel.stage_events`).

    At the position of forward node i, the live bytes are ``saved_bytes @ S[t]`` plus
    ``coef[e] * x[e]`` for every event e with ``pos[e] <= i``, where x[e] is S[t, index[e]] (kind
    KEEP), S[t + 1, index[e]] (KEEP_NEXT), R[t, index[e]] (RECOMPUTE) or L[index[e]] (LIVE).  L
    has one entry l per (group ``lam_group[l]``, forward reader ``lam_reader[l]`` the stage may
    recompute), by group then reader, with L[l] = max(R[t, lam_reader[l]], L[l + 1]), or
    max(R[t, lam_reader[l]], S[t + 1, lam_group[l]]) for a group's last reader
    (``lam_last[l]``): the ILP writes these as ``>=`` rows.  After every event (position N) the
    sum is `MemoryModel.kept_at_backward`'s.  Arrays: (L,) and (E,) ints, ``coef`` bytes.
    """

    lam_group: np.ndarray
    lam_reader: np.ndarray
    lam_last: np.ndarray
    pos: np.ndarray
    kind: np.ndarray
    index: np.ndarray
    coef: np.ndarray


@dataclass
class MemoryModel:
    """Coefficients of the ILP's memory constraints (bytes); see the module docstring.

    Attributes:
        fwd_const: (N,) bytes live while forward node k runs that do not depend on S or M.
        fwd_keep: (N, G) fwd_keep[k, g] = bytes of group g live while node k runs only if kept.
        fwd_opt: (N, O) bytes node k allocates (option-specific outputs + workspace) per option.
        groups: (G,) list of group keys ``(node, slot)`` or ``(node, slot, impl)``; ``group_node[g]``
            its forward node, ``group_option[g]`` the option it belongs to (-1: every option),
            ``group_of`` value name (in the base graph) -> group index.
        bwd_const: (T,) constants + outputs + backward values live at stage t (base graph).
        live_opt: (T, O) what option o adds to (or takes from) the backward values live at stage t.
        bwd_extra: (T,) outputs + workspace of backward node t (0 for governed nodes: see bwd_opt).
        bwd_opt: (T, O) outputs + workspace of a governed backward node per option.
        saved_bytes: (G,) bytes a kept group holds.
        out_bytes: (N,) bytes a recomputed forward node allocates (largest over its options).
        fwd_workspace: (N,) workspace of each forward node when recomputed (0 for choice nodes:
            see rec_ws), with a random node's generator state held during its replay (`monet.rng`).
        rec_ws: list of (node, option, bytes): a choice node's workspace under an option.
        reads: (K, 3) int array of (stage t, group g, option o or -1): stage t reads g (if o).
        read_edges: (E, 2) int array of (group g, forward node k): k reads g.
        bwd_read_group: (T, G) bool: backward node t reads group g (under some option).
        bwd_read_bytes: (T, N) bytes of node j's groups that backward node t reads (under any
            option; at most ``out_bytes[j]``): what a recomputation of j leaves live while
            backward node t runs (its other outputs die at once or after their last reader).
        options: the `Option` list; ``choices``: option indices per choice.
        constant: parameters + buffers + input + output gradient (+ `OpGraph.library_bytes` on CUDA).
        rng_state_bytes: (N,) generator state the executor saves before random node k if some
            stage recomputes it (`monet.rng`; 5,056 bytes on CPU; on a CUDA graph the state's
            allocator block, as the simulator counts it: 512 bytes; 0 for other nodes).  Counted
            from node k on in the forward pass and through every stage (the executor frees it
            after its last recomputation) if R recomputes node k anywhere, and once more while
            node k is replayed (``fwd_workspace``: the generator's own state, held to restore it).
        ancestors: (N, N) bool: forward node i depends on forward node j, transitively
            (`monet.matrices.ancestors`); what a stage may recompute to get what it reads.
        offload: the `solver.offload.OffloadModel` (None: no offload).  The peaks below take the
            offloaded groups O (G,) 0/1; without O, `OffloadModel.effective` of the schedule
            (the allowed groups it keeps through their off-device window).
    """

    fwd_const: np.ndarray
    fwd_keep: np.ndarray
    bwd_const: np.ndarray
    bwd_extra: np.ndarray
    saved_bytes: np.ndarray
    out_bytes: np.ndarray
    fwd_workspace: np.ndarray
    constant: int
    groups: list
    group_node: np.ndarray
    group_of: dict
    group_option: np.ndarray = None
    fwd_opt: np.ndarray = None
    bwd_opt: np.ndarray = None
    rec_ws: list = field(default_factory=list)
    reads: np.ndarray = None
    options: list = field(default_factory=list)
    choices: list = field(default_factory=list)
    read_edges: np.ndarray = None
    bwd_read_group: np.ndarray = None
    bwd_read_bytes: np.ndarray = None
    live_opt: np.ndarray = None
    rng_state_bytes: np.ndarray = None
    ancestors: np.ndarray = None
    offload: object = None  # `solver.offload.OffloadModel` when offload to host is planned

    @property
    def n_options(self) -> int:
        return len(self.options)

    @property
    def n_fwd(self) -> int:
        """N, the forward nodes."""
        return len(self.out_bytes)

    @property
    def n_bwd(self) -> int:
        """T, the backward nodes (stages)."""
        return len(self.bwd_const)

    def node_to_group(self, S_nodes: np.ndarray) -> np.ndarray:
        """(T, N) node-level keep matrix -> (T, G): a kept node keeps all its groups."""
        return np.asarray(S_nodes)[:, self.group_node]

    def group_to_node(self, S_groups: np.ndarray) -> np.ndarray:
        """(T, G) -> (T, N): a node is kept when any of its groups is."""
        S_groups = np.asarray(S_groups, dtype=bool)
        out = np.zeros((S_groups.shape[0], len(self.out_bytes)), dtype=bool)
        for g, i in enumerate(self.group_node):
            out[:, i] |= S_groups[:, g]
        return out

    def default_options(self) -> np.ndarray:
        """(O,) one-hot M choosing PyTorch's implementation everywhere."""
        M = np.zeros(self.n_options)
        for opts in self.choices:
            M[opts[0]] = 1.0
        return M

    def rng_saved(self, R: np.ndarray | None) -> np.ndarray:
        """(N,) bytes of generator state saved per forward node for recomputations R (T, N)
        (`rng_state_bytes` where some stage recomputes the node; zeros for R None)."""
        if R is None or self.rng_state_bytes is None:
            return np.zeros(len(self.fwd_const))
        return self.rng_state_bytes * (np.asarray(R) > 0.5).any(axis=0)

    def fwd_peak(self, keep: np.ndarray, M: np.ndarray | None = None, R: np.ndarray | None = None,
                 O: np.ndarray | None = None) -> float:
        """Peak of the forward pass for a keep vector (G,) of 0/1 over groups, options M (O,) and
        the recomputations R (T, N) of the backward pass, whose random nodes' generator states
        the forward pass saves (None: no random node recomputed), with the groups O (G,) 0/1
        offloaded (None: none; this row alone cannot tell which a schedule keeps through)."""
        M = self.default_options() if M is None else np.asarray(M, dtype=float)
        rows = self.fwd_const + self.fwd_keep @ np.asarray(keep, dtype=float) + self.fwd_opt @ M \
            + np.cumsum(self.rng_saved(R))
        if O is not None and self.offload is not None:
            rows = rows - self.offload.fwd_off() @ np.asarray(O, dtype=float)
        return float(np.max(rows))

    def offloaded(self, S: np.ndarray, R: np.ndarray | None, O: np.ndarray | None) -> np.ndarray | None:
        """O (G,) as given, or the schedule's effective offloads (`OffloadModel.effective`); None
        without offload."""
        if self.offload is None:
            return None
        return self.offload.effective(S, R) if O is None else np.asarray(O) > 0.5

    def next_keep(self, S: np.ndarray) -> np.ndarray:
        """(T, G) bool: S (T, G) of the next stage, ``S[t + 1]`` (nothing after the last stage)."""
        S = np.asarray(S) > 0.5
        out = np.zeros_like(S)
        out[:-1] = S[1:]
        return out

    def held(self) -> np.ndarray:
        """(T, G) bool: the groups a stage counts by S[t] (kept at its start) rather than S[t + 1]
        (kept into the next stage) while its backward node runs: those the backward node reads,
        and with offload the candidates in the last stage before their prefetch stage (their
        ``O[g] <= S[t, g]`` holds there, their S[t + 1] is free)."""
        hold = self.bwd_read_group.copy()
        if self.offload is not None:
            off = self.offload
            g = np.flatnonzero(off.candidate & (off.prefetch > 0))
            hold[off.prefetch[g] - 1, g] = True
        return hold

    def recompute_workspace(self, M: np.ndarray) -> np.ndarray:
        """(N,) workspace bytes of each forward node when recomputed, under the options M (O,)."""
        ws = self.fwd_workspace.astype(float).copy()
        for i, o, w in self.rec_ws:
            if M[o] > 0.5:
                ws[i] = max(ws[i], w)
        return ws

    def bwd_peaks(self, S: np.ndarray, R: np.ndarray, M: np.ndarray | None = None,
                  O: np.ndarray | None = None) -> np.ndarray:
        """(T,) upper bound of each backward stage's peak (bytes) for 0/1 S (T, G), R (T, N), M (O,)
        and offloaded groups O (G,) (see `offloaded`): the largest of the rows of the module
        docstring, exactly as the ILP writes them."""
        M = self.default_options() if M is None else np.asarray(M, dtype=float)
        O = self.offloaded(S, R, O)
        S = np.asarray(S) > 0.5
        R = np.asarray(R) > 0.5
        U = self.bwd_const + self.rng_saved(R).sum()
        if O is not None:
            U = U - self.offload.bwd_off() @ O.astype(float)
        if self.n_options and self.live_opt is not None:
            U = U + self.live_opt @ M
        held = self.held()
        peaks = U + self.kept_at_backward(S, R, held) + self.bwd_extra + self.bwd_opt @ M
        ts = np.flatnonzero(R.any(axis=1))  # only the stages that recompute have these rows
        if len(ts):
            rows = self.live_while_recomputing(S, R, held, ts) + self.out_bytes + self.recompute_workspace(M)
            U_ts = U[ts] if np.ndim(U) else U
            peaks[ts] = np.maximum(peaks[ts], U_ts + np.where(R[ts], rows, -np.inf).max(axis=1))
        return peaks

    def live_while_recomputing(self, S: np.ndarray, R: np.ndarray, held: np.ndarray | None = None,
                               stages: np.ndarray | None = None) -> np.ndarray:
        """(T, N) bytes of forward values live in stage t while forward node i recomputes (its own
        outputs and workspace not included; meaningful where R[t, i]), for 0/1 S (T, G), R (T, N)
        and ``held`` = `held` ().  With ``stages`` (ascending stage indices), only those rows,
        (len(stages), N): on a deep network few stages recompute (per-block checkpointing: one
        per block), and the full (T, N) arrays of a 96-layer GPT-2 took seconds per schedule.

        A group g of node j counts: S[t, g] if i < j (kept, not yet recomputed); nothing if i = j
        (node i's outputs count as ``out_bytes[i]``); if i > j, S[t, g] when backward node t reads
        g (`held`; its recomputed values as ``bwd_read_bytes[t, j]`` R[t, j] per node), else
        max(S[t + 1, g], R[t, k] for the forward readers k >= i of g): kept into the next stage or
        read by a recomputation still to come, which is when the executor holds it (it frees a
        kept or recomputed value after its last use).  `stage_events` writes the same as linear
        terms for the ILP; tests/test_memory_model.py holds the two equal.
        """
        S = np.asarray(S) > 0.5
        R = np.asarray(R) > 0.5
        held = self.held() if held is None else held
        S1 = self.next_keep(S)
        read_bytes = self.bwd_read_bytes
        if stages is not None:
            S, S1, R, held, read_bytes = S[stages], S1[stages], R[stages], held[stages], read_bytes[stages]
        T, N = R.shape
        gn, b = self.group_node, self.saved_bytes

        def per_node(W):  # (T, G) bytes -> (T, N + 1) summed over each node's groups
            idx = (np.arange(T)[:, None] * (N + 1) + gn[None, :]).ravel()
            return np.bincount(idx, weights=W.ravel(), minlength=T * (N + 1)).reshape(T, N + 1)

        kept = per_node(S * b)
        mine = per_node(held * S * b)
        before = np.cumsum(mine, axis=1) - mine  # held groups of nodes before i
        later = kept[:, ::-1].cumsum(axis=1)[:, ::-1] - kept  # kept groups of nodes after i
        rec = np.zeros((T, N + 1))
        rec[:, :N] = R * read_bytes
        rec = np.cumsum(rec, axis=1) - rec  # recomputed nodes before i, the groups t reads
        # the other groups of nodes before i: from node + 1 on while kept into t + 1, else up to the
        # last forward reader the stage recomputes (``read_edges`` is sorted by group, then reader)
        eg, ek = self.read_edges[:, 0], self.read_edges[:, 1]
        last = np.full((T, len(gn)), -1)
        if len(eg):
            start = np.flatnonzero(np.r_[True, eg[1:] != eg[:-1]])
            last[:, eg[start]] = np.maximum.reduceat(np.where(R[:, ek], ek[None, :], -1), start, axis=1)
        end = np.where(S1, N, last)  # counted at positions node + 1 .. end
        t_on, g_on = np.nonzero(~held & (end > gn[None, :]))
        idx = np.concatenate([t_on * (N + 2) + gn[g_on] + 1, t_on * (N + 2) + end[t_on, g_on] + 1])
        d = np.bincount(idx, weights=np.concatenate([b[g_on], -b[g_on]]), minlength=T * (N + 2))
        other = np.cumsum(d.reshape(T, N + 2), axis=1)[:, :N + 1]
        return (later + before + rec + other)[:, :N]

    def kept_at_backward(self, S: np.ndarray, R: np.ndarray, held: np.ndarray | None = None) -> np.ndarray:
        """(T,) bytes of forward values live while backward node t runs, for 0/1 S (T, G), R (T, N):
        the groups it reads (`held`), kept (S[t]) or recomputed in the stage (``bwd_read_bytes``),
        and the other groups kept into the next stage (S[t + 1])."""
        S = np.asarray(S) > 0.5
        held = self.held() if held is None else held
        kept = np.where(held, S, self.next_keep(S))
        return kept @ self.saved_bytes + ((np.asarray(R) > 0.5) * self.bwd_read_bytes).sum(axis=1)

    def stage_events(self, t: int, nodes: np.ndarray, held: np.ndarray | None = None) -> StageEvents:
        """`live_while_recomputing` of stage t as linear terms (`StageEvents`), for the ascending
        forward nodes ``nodes`` (n,) the ILP lets the stage recompute and ``held`` (G,) =
        ``held()[t]``."""
        nodes = np.asarray(nodes, dtype=int)
        held = self.held()[t] if held is None else held
        gn, b = self.group_node, self.saved_bytes
        G = len(gn)
        eg, ek = self.read_edges[:, 0], self.read_edges[:, 1]
        act = np.isin(ek, nodes) & ~held[eg]
        lg, lk = eg[act], ek[act]  # L variables: (group, reader), by group then reader as read_edges
        n_l = len(lg)
        last = np.ones(n_l, dtype=bool)
        last[:-1] = lg[1:] != lg[:-1]
        first = np.ones(n_l, dtype=bool)
        first[1:] = lg[1:] != lg[:-1]
        first_l = np.full(G, -1)
        first_l[lg[first]] = np.flatnonzero(first)
        # events (position, kind, index, bytes): from ``position`` on, the term bytes * x[kind][index]
        # is added to what is live; before any event every group counts S[t, g]
        g = np.arange(G)
        plain = ~held & (first_l < 0)
        withl = ~held & (first_l >= 0)
        rb = self.bwd_read_bytes[t, nodes]
        pos = [gn, gn[held] + 1, gn[plain] + 1, gn[withl] + 1, lk + 1, lk[~last] + 1, lk[last] + 1, nodes + 1]
        kind = [np.full(G, KEEP), np.full(held.sum(), KEEP), np.full(plain.sum(), KEEP_NEXT),
                np.full(withl.sum(), LIVE), np.full(n_l, LIVE), np.full((~last).sum(), LIVE),
                np.full(last.sum(), KEEP_NEXT), np.full(len(nodes), RECOMPUTE)]
        index = [g, g[held], g[plain], first_l[withl], np.arange(n_l), np.flatnonzero(~last) + 1, lg[last], nodes]
        coef = [-b, b[held], b[plain], b[withl], -b[lg], b[lg[~last]], b[lg[last]], rb]
        pos, kind, index, coef = (np.concatenate(x) for x in (pos, kind, index, coef))
        keep = coef != 0
        return StageEvents(lam_group=lg, lam_reader=lk, lam_last=last, pos=pos[keep], kind=kind[keep],
                           index=index[keep], coef=coef[keep])

    def floor(self) -> float:
        """Bytes under which no schedule's `peak` goes with PyTorch's implementations and no
        offload: the peak of keeping nothing and recomputing nothing.  Keeping and recomputing
        only add to every row (`fwd_peak`, `bwd_peaks`), so a budget below it is infeasible."""
        T, G = len(self.bwd_const), len(self.groups)
        return self.peak(np.zeros((T, G), dtype=bool), np.zeros((T, self.n_fwd), dtype=bool), O=None)

    def peak(self, S: np.ndarray, R: np.ndarray, M: np.ndarray | None = None, O: np.ndarray | None = None) -> float:
        """The ILP's peak for a schedule: max of the forward and every backward stage (bytes), with
        the groups O (G,) offloaded (None: `offloaded`).

        This is the ILP's linear accounting, an upper bound of the reference peak, `monet.simulate`'s
        `schedule_peak` of the same schedule (the executor's modules replayed op by op): fitting it
        fits the budget.  Tests hold it to that: tests/test_memory_model.py
        (``test_ilp_memory_bounds_simulator``, ``..._with_implementations``, ``..._on_offloads`` and
        ``test_ilp_memory_tight_on_checkpoint_schedules``: >= the simulator's peak, and within 5 % of
        it on checkpoint schedules) and tests/test_offload.py
        (``test_ilp_and_simulator_agree_on_offloaded_bytes``)."""
        O = self.offloaded(S, R, O)
        return max(self.fwd_peak(np.asarray(S)[0], M, R, O), float(self.bwd_peaks(S, R, M, O).max()))
