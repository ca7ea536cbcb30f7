"""Schedules built from whole blocks: per-block checkpointing and what lies around it.

On a chain of identical blocks (`monet.solver.blocks`) the schedules people run are block-level:
``torch.utils.checkpoint`` around each layer (transformers' ``gradient_checkpointing_enable``),
around every n-th layer (its ``every_n_layers``), selective activation checkpointing inside each
layer (torchtitan's policy: keep what matrix products and attention compute, recompute the
rest).  Each is a *block policy*, the set of a block's values kept through the backward pass, the
rest recomputed once, in the backward stage that first reads them, and kept from there until
their last reader (`monet.solver.repair.checkpointed`: ``torch.utils.checkpoint``'s semantics).

The chain level (rotor, Herrmann et al. 2019; Rockmate, Zhao et al. ICML 2023) is solved here as
a knapsack over identical items: every policy is measured once on the whole graph (the blocks but
the last under it: the last block's backward runs first, when everything else is held anyway, so
it keeps everything at no cost in peak), the policies on the lower convex hull of (peak,
recomputation seconds) are paired, and for each adjacent pair the number of blocks under the
richer policy is bisected to the largest whose peak fits the budget (the peak grows with it, the
recomputation falls).  The richer blocks are the latest ones.  Every candidate's peak is the
ILP's memory expression (`MemoryModel.peak`, which bounds the simulator's), so a candidate that
fits is a valid start for the node-level search (`monet.solver.repair.improve`), which then
refines it node by node: per-block checkpointing is one of the candidates, so the solver is never
worse than it where it fits.

Without a budget (the smallest-budget search) the candidates are the uniform policies.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from monet.graph import OpGraph
from monet.solver.blocks import Chain, find_chains
from monet.solver.memory_model import MemoryModel
from monet.solver.repair import bounded, checkpointed

#: operators whose outputs selective activation checkpointing keeps (torchtitan's policy: matrix
#: products and attention; here with the addmm of GPT-2's Conv1D and convolutions)
COMPUTE_OPS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten.convolution.",
               "aten._scaled_dot_product", "aten._flash_attention", "aten._efficient_attention",
               "aten.linear.")
#: fractions of a block's values kept by the per-byte policies (most recomputation per byte first)
QUANTILES = (0.25, 0.5, 0.75)
#: the moves `Structure.grown` evaluates per step, most recomputation per byte first (more while
#: none of them fits the budget and lowers the recomputation)
GROW_TRIES = 6


@dataclass
class Candidate:
    """A schedule built from block policies: ``name`` says which, S (T, G) and R (T, N) its
    matrices, ``peak`` the ILP's memory of it (bytes), ``cost`` its recomputation (seconds)."""

    name: str
    S: np.ndarray
    R: np.ndarray
    peak: float
    cost: float


class Structure:
    """The chains of a graph and the policies of their blocks, for building block-level schedules.

    Args:
        graph: the `OpGraph` (``graph.joint`` is read for the op signatures unless ``chains``).
        mem: its `MemoryModel`.
        recompute_s: (N,) seconds to recompute each forward node.
        allow_s: (T, G) where the ILP may keep a group (`monet.solver.formulation.allowed`).
        chains: the chains (default `find_chains` of the graph).
    """

    def __init__(self, graph: OpGraph, mem: MemoryModel, recompute_s, allow_s: np.ndarray,
                 chains: list[Chain] | None = None):
        self.graph, self.mem, self.allow_s = graph, mem, allow_s
        self.recompute_s = np.asarray(recompute_s, dtype=float)
        self.chains = find_chains(graph) if chains is None else chains
        N = len(graph.fwd)
        self.blocks = [list(c.block(k)) for c in self.chains for k in range(c.count)]
        self.block_chain = [ci for ci, c in enumerate(self.chains) for _ in range(c.count)]
        inside = np.zeros(N, dtype=bool)
        owner = np.full(N, -1)
        for b, nodes in enumerate(self.blocks):
            inside[nodes] = True
            owner[nodes] = b
        # a block's outputs: what a node outside the block reads (the next block's input)
        boundary = np.zeros(N, dtype=bool)
        for n in graph.fwd:
            for i in n.fwd_inputs:
                if owner[i] >= 0 and owner[i] != owner[n.id]:
                    boundary[i] = True
        self.outside, self.boundary, self.owner = ~inside, boundary, owner

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    def policies(self) -> dict[str, list[np.ndarray]]:
        """The block policies: name -> for each block, the bool mask over its nodes of those kept.
        ``recompute`` keeps none (per-block checkpointing), ``full`` all, ``compute`` the outputs
        of `COMPUTE_OPS` (selective activation checkpointing), ``q25``/``q50``/``q75`` that
        fraction of the block's saved bytes, most recomputation seconds per byte first."""
        graph = self.graph
        saved = np.array([n.saved_bytes for n in graph.fwd], dtype=float)
        out: dict[str, list[np.ndarray]] = {"recompute": [], "compute": [], "full": []}
        out.update({f"q{int(100 * q)}": [] for q in QUANTILES})
        for nodes in self.blocks:
            nodes = np.asarray(nodes)
            out["recompute"].append(np.zeros(len(nodes), dtype=bool))
            out["full"].append(np.ones(len(nodes), dtype=bool))
            out["compute"].append(np.array([graph.fwd[i].op.startswith(COMPUTE_OPS) for i in nodes]))
            per_byte = self.recompute_s[nodes] / np.maximum(saved[nodes], 1.0)
            order = np.argsort(-per_byte, kind="stable")
            share = np.cumsum(saved[nodes][order]) / max(saved[nodes].sum(), 1.0)
            for q in QUANTILES:
                mask = np.zeros(len(nodes), dtype=bool)
                mask[order[:max(1, int(np.searchsorted(share, q)) + 1)]] = True
                out[f"q{int(100 * q)}"].append(mask)
        return out

    def keep_groups(self, masks: list[np.ndarray]) -> np.ndarray:
        """(G,) bool: the groups kept through the backward pass when block b keeps ``masks[b]``:
        every node outside the blocks, the blocks' boundary outputs, and the masked nodes."""
        keep = self.outside | self.boundary
        for nodes, mask in zip(self.blocks, masks):
            keep[np.asarray(nodes)[mask]] = True
        return keep[self.mem.group_node]

    def candidate(self, name: str, masks: list[np.ndarray]) -> Candidate:
        """The schedule of these block masks (`keep_groups`), checkpointed (`repair.checkpointed`)."""
        S, R = checkpointed(self.graph, self.mem, self.keep_groups(masks), self.allow_s)
        return Candidate(name, S, R, self.mem.peak(S, R), float(self.recompute_s @ R.sum(axis=0)))

    def per_block(self, policies: dict | None = None) -> Candidate:
        """Per-block checkpointing as ``torch.utils.checkpoint`` around every block runs it, the
        last block recomputed too (``blocks:recompute-every``)."""
        policies = self.policies() if policies is None else policies
        return self.candidate("blocks:recompute-every", policies["recompute"])

    def uniform(self, policies: dict | None = None) -> list[Candidate]:
        """One candidate per policy: every block under it but the last, which keeps everything;
        and `per_block`."""
        policies = self.policies() if policies is None else policies
        out = [self.per_block(policies)]
        for name, masks in policies.items():
            masks = list(masks)
            masks[-1] = np.ones(len(self.blocks[-1]), dtype=bool)
            out.append(self.candidate(f"blocks:{name}", masks))
        return out

    def mixes(self, uniform: list[Candidate], policies: dict, budget: float) -> list[Candidate]:
        """For each adjacent pair (A, B) of policies on the lower convex hull of the uniform
        candidates' (peak, cost) whose peaks straddle ``budget`` bytes, `mixed`'s two schedules."""
        def policy(c: Candidate) -> str:
            return c.name.split(":", 1)[1]

        hull = lower_hull([(c.peak, c.cost, c) for c in uniform if policy(c) in policies])
        out = []
        for (pa, _, a), (pb, _, b) in zip(hull, hull[1:]):
            if pa <= budget < pb:
                out += self.mixed(policy(a), policies[policy(a)], policy(b), policies[policy(b)], budget)
        return out

    def mixed(self, a: str, A: list[np.ndarray], b: str, B: list[np.ndarray], budget: float,
              deadline: float | None = None) -> list[Candidate]:
        """The schedule with the most blocks under policy B (per-block masks; the latest blocks,
        the last block always keeping everything) and the rest under A whose peak fits ``budget``
        bytes (bisected: the peak grows with the number of B blocks), and the one with one block
        more under B, whose ILP memory is over the budget (the simulator may fit it:
        `monet.solver.search.search`'s ``peak_of``).  ``deadline`` (a `time.perf_counter` value)
        stops the bisection early on a graph the search bounds (`monet.solver.repair.bounded`)."""
        n = self.n_blocks
        last = np.ones(len(self.blocks[-1]), dtype=bool)
        limited = bounded(deadline, self.allow_s)

        def mix(m: int) -> Candidate:
            masks = [B[k] if k >= n - 1 - m else A[k] for k in range(n - 1)] + [last]
            return self.candidate(f"blocks:{a}+{m}x{b}", masks)

        lo, hi, best = 0, n - 1, None
        while lo <= hi and not (limited and time.perf_counter() >= deadline):
            mid = (lo + hi) // 2
            c = mix(mid)
            if c.peak <= budget:
                best, lo = c, mid + 1
            else:
                hi = mid - 1
        out = [] if best is None else [best]
        return out + [mix(lo)] if lo <= n - 1 else out

    def grown(self, budget: float, deadline: float | None = None, tries: int = GROW_TRIES) -> list[Candidate]:
        """A block policy grown from per-block checkpointing, one kept value at a time, as far as
        ``budget`` bytes allow, and its `mixed` with the next richer policy.

        Every block but the last (which keeps everything) keeps the same values, a mask over its
        chain's block positions.  From keeping none (the blocks' outputs only), each step tries
        adding one position, the ``tries`` of most recomputation seconds per saved byte first
        (more while none is taken), builds each trial's schedule (`candidate`), and takes the one
        that removes the most recomputation seconds per byte of ILP peak added among those within
        the limit: the budget, or the start's peak where that is higher (a kept value can lower
        the peak: a block recomputed whole holds all its values at once).  It stops when none is
        within it.  The cheapest step that fits the budget is returned, and where it is the last,
        its mixes; where none fits, the last step, which the simulator may fit
        (`monet.solver.search.simulated_fits`).  ``deadline`` (a `time.perf_counter` value, on
        graphs the search bounds: `monet.solver.repair.bounded`) may stop it at any step.

        The knapsack of rotor (Herrmann et al. 2019) and Rockmate (Zhao et al. ICML 2023) over
        one block, with the peak the ILP's memory of the whole graph: the per-byte quantile
        policies (`policies`) keep a block's large attention values with the small ones around
        them, which the peak does not allow.

        Returns the ``blocks:grown`` schedules (see above).
        """
        limited = bounded(deadline, self.allow_s)
        saved = np.array([n.saved_bytes for n in self.graph.fwd], dtype=float)
        moves = sorted(((ci, p) for ci, c in enumerate(self.chains) for p in range(c.period)
                        if saved[c.start + p] > 0),
                       key=lambda m: -self.recompute_s[self.chains[m[0]].start + m[1]]
                       / saved[self.chains[m[0]].start + m[1]])
        last = np.ones(len(self.blocks[-1]), dtype=bool)

        def masks(policy):
            return [policy[ci] for ci in self.block_chain][:-1] + [last]

        keep = [np.zeros(c.period, dtype=bool) for c in self.chains]
        cur = self.candidate("blocks:grown", masks(keep))
        limit = max(budget, cur.peak)
        fit = cur if cur.peak <= budget else None
        over = None
        while not (limited and time.perf_counter() >= deadline):
            best = over = None
            for k, (ci, p) in enumerate(m for m in moves if not keep[m[0]][m[1]]):
                if k >= tries and best is not None:
                    break
                trial = [m.copy() for m in keep]
                trial[ci][p] = True
                c = self.candidate("blocks:grown", masks(trial))
                if c.cost >= cur.cost:
                    continue
                ratio = (cur.cost - c.cost) / max(c.peak - cur.peak, 1.0)
                if c.peak <= limit and (best is None or ratio > best[0]):
                    best = (ratio, trial, c)
                elif c.peak > limit and (over is None or ratio > over[0]):
                    over = (ratio, trial)
            if best is None:
                break
            (_, keep, cur), over = best, None  # the mix needs a richer trial of the policy kept now
            if cur.peak <= budget:
                fit, limit = cur, budget
        if fit is None:
            return [cur]
        if fit is not cur or over is None:
            return [fit]
        return [fit] + self.mixed("grown", masks(keep), "grown+1", masks(over[1]), budget, deadline)

    def candidates(self, budget: float | None, deadline: float | None = None, grow: bool = True) -> list[Candidate]:
        """The block-level candidates for ``budget`` bytes (None: for the smallest budget): the
        uniform policies, their best mixes under the budget, and (``grow``) the policy `grown`
        under it (until ``deadline``, a `time.perf_counter` value, on a graph the search bounds)."""
        if not self.blocks:
            return []
        policies = self.policies()
        uniform = self.uniform(policies)
        out = list(uniform)
        if budget is not None:
            out += self.mixes(uniform, policies, budget) + (self.grown(budget, deadline) if grow else [])
        return out


def lower_hull(points: list[tuple]) -> list[tuple]:
    """The points (x, y, ...) on the lower-left convex hull (x increasing, y decreasing): the
    policies no mix of two others beats in both peak and recomputation."""
    pts = sorted(points, key=lambda p: (p[0], p[1]))
    front = []
    for p in pts:  # Pareto front: y strictly decreasing
        if not front or p[1] < front[-1][1]:
            front.append(p)
    hull: list[tuple] = []
    for p in front:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2][:2], hull[-1][:2]
            # drop the middle point when it lies on or above the segment from hull[-2] to p
            if (y2 - y1) * (p[0] - x1) >= (p[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def structured_candidates(graph: OpGraph, mem: MemoryModel, recompute_s, allow_s: np.ndarray,
                          budget: float | None, deadline: float | None = None, grow: bool = True) -> list[Candidate]:
    """`Structure.candidates` of ``graph`` (none without chains of identical blocks or without a
    joint graph to read their signatures from)."""
    if graph.joint is None:
        return []
    return Structure(graph, mem, recompute_s, allow_s).candidates(budget, deadline, grow)


__all__ = ["COMPUTE_OPS", "Candidate", "GROW_TRIES", "QUANTILES", "Structure", "lower_hull", "structured_candidates"]
