"""A start schedule from a dynamic program over the blocks between articulation points.

Most networks are chains of blocks: ResNet's bottlenecks, a transformer's attention and MLP
halves, MobileNet's inverted residuals.  A forward node k is an *articulation point* when no value
produced before k is read after it: only k's output crosses from one block to the next.  Over such
a chain, rotor's dynamic program (Herrmann et al. 2019, "Optimal checkpointing for heterogeneous
chains", Sec. 4, its persistent schedules) finds, for a memory limit, which block outputs to keep
as checkpoints and which blocks to recompute from them, recursively: ``opt(s, t, m)``, the least
time to run the backward pass of blocks s+1..t with the output of block s held and m bytes for the
rest, is the better of

* **store block s+1** (rotor's F_all) with one of its *options* (Rockmate, Zhao et al. 2023: per
  block, which of its values to keep for its backward pass and which to recompute there), then
  ``opt(s+1, t, m - kept bytes)``, and block s+1's own backward pass with its kept bytes in m;
* **checkpoint block j's output** (rotor's F_ck, s < j < t): recompute blocks s+1..j, keep their
  output, then ``opt(j, t, m - its bytes) + opt(s, j, m)``.

Memory is discretised in `LEVELS` steps of the budget and the DP runs vectorised over them.  Its
memory is an estimate (a block's kept values live through its whole backward pass; the bytes that
do not depend on the schedule are the largest of each block's backward stages), so the schedule is
turned into a keep matrix, `solver.repair.repair`ed and measured with the ILP's own
`MemoryModel.peak`; the DP runs again at smaller limits until the schedule fits the budget.

Why: the local search (`solver.repair.improve`) and the window knapsack (`solver.windows`) move one
node at a time from keep-everything and stop where single moves do not pay; at tight budgets the
good schedules recompute whole blocks from checkpoints, which a DP over the chain finds directly.
What it gave is in BENCHMARKS.md ("Solver at full scale").
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from monet.graph import OpGraph
from monet.solver.memory_model import MemoryModel
from monet.solver.repair import repair

LEVELS = 400  # memory steps of the DP (the budget / LEVELS each)
KEEP_FRACTIONS = (1.0, 0.75, 0.5, 0.25, 0.0)  # options: the share of a block's values kept


@dataclass
class Block:
    """Forward nodes ``lo..hi`` (inclusive), ``hi`` an articulation point (or the last node);
    ``stages`` the backward stages that read its values (first, last) or None."""

    lo: int
    hi: int
    stages: tuple[int, int] | None


@dataclass
class _Option:
    """Which of a block's groups its backward pass finds kept: ``groups`` (indices), ``bytes``
    they and the transient of what is recomputed take, ``seconds`` of recomputation."""

    groups: np.ndarray
    bytes: float
    seconds: float


def articulation_blocks(graph: OpGraph, mem: MemoryModel) -> list[Block]:
    """The chain of blocks of ``graph``: split after every forward node k such that no forward
    edge i -> j with i < k < j... (i < k <= j with i != k) crosses it, then merged where the
    backward stages of consecutive blocks interleave (a block's backward must start after the
    next block's has ended, as in a chain) and where a block has no backward reader."""
    N, T = len(graph.fwd), len(graph.bwd)
    last = np.full(N, -1)
    for n in graph.fwd:
        for i in n.fwd_inputs:
            last[i] = max(last[i], n.id)
    reach = np.maximum.accumulate(last)  # the furthest reader of anything produced up to k
    cuts = [k for k in range(N - 1) if last[k] > k and (k == 0 or reach[k - 1] <= k)]
    bounds = [-1] + cuts + [N - 1]
    rt, rg = mem.reads[:, 0], mem.reads[:, 1]
    node_of_read = mem.group_node[rg]
    blocks: list[Block] = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        ts = rt[(node_of_read > a) & (node_of_read <= b)]
        blocks.append(Block(a + 1, b, (int(ts.min()), int(ts.max())) if len(ts) else None))
    merged: list[Block] = []
    for blk in blocks:
        prev = merged[-1] if merged else None
        if prev is not None and (prev.stages is None or (blk.stages is not None and blk.stages[1] > prev.stages[0])):
            stages = blk.stages if prev.stages is None else (
                prev.stages if blk.stages is None else (min(prev.stages[0], blk.stages[0]),
                                                        max(prev.stages[1], blk.stages[1])))
            merged[-1] = Block(prev.lo, blk.hi, stages)
        else:
            merged.append(blk)
    if merged and merged[-1].stages is None and len(merged) > 1:
        last_blk = merged.pop()
        merged[-1] = Block(merged[-1].lo, last_blk.hi, merged[-1].stages)
    return merged


def _block_options(graph: OpGraph, mem: MemoryModel, blk: Block, recompute_s: np.ndarray, inputs: list[tuple]):
    """The options of one block (`_Option` list, keep-everything first): keep the values its
    backward pass reads in order of recomputation seconds per byte (convolutions and matrix
    products before element-wise operators, as MONeT's and Checkmate's schedules do), the
    shares `KEEP_FRACTIONS` of them; what is not kept is recomputed from the kept values, once."""
    gnode = mem.group_node
    nodes = set(range(blk.lo, blk.hi + 1))
    read = np.unique(mem.reads[:, 1][np.isin(gnode[mem.reads[:, 1]], list(nodes))])
    out = np.flatnonzero(gnode == blk.hi)  # the checkpoint: the block's output
    tiny = read[mem.saved_bytes[read] < 2 ** 20]  # (BatchNorm's statistics): always kept
    rest = np.setdiff1d(read, tiny)
    per_byte = recompute_s[gnode[rest]] / np.maximum(mem.saved_bytes[rest], 1.0)
    rest = rest[np.argsort(-per_byte, kind="stable")]
    options, seen = [], set()
    for f in KEEP_FRACTIONS:
        kept = np.union1d(np.union1d(tiny, rest[:int(np.ceil(f * len(rest)))]), out)
        key = tuple(kept.tolist())
        if key in seen:
            continue
        seen.add(key)
        have = set(gnode[kept].tolist())
        need: set[int] = set()
        todo = [int(gnode[g]) for g in np.setdiff1d(read, kept)]
        while todo:  # what is not kept, and its unkept inputs within the block
            i = todo.pop()
            if i in need or i in have or i not in nodes:
                continue
            need.add(i)
            todo += list(inputs[i])
        sizes = sorted((mem.out_bytes[i] for i in need), reverse=True)
        options.append(_Option(kept, float(mem.saved_bytes[kept].sum() + sum(sizes[:2])),
                               float(sum(recompute_s[i] for i in need))))
    return options


def _chain_seconds(graph: OpGraph, blk: Block, recompute_s: np.ndarray, anc: list[set[int]]) -> float:
    """Seconds to recompute the block's output from its input: its ancestors within the block."""
    nodes = [i for i in anc[blk.hi] if i >= blk.lo] + [blk.hi]
    return float(sum(recompute_s[i] for i in nodes))


def block_schedule(graph: OpGraph, mem: MemoryModel, allow_s: np.ndarray, budget: float,
                   recompute_s: np.ndarray, deadline: float | None = None):
    """The DP's schedule that fits ``budget`` bytes in the ILP's memory (`MemoryModel.peak`):
    (S (T, G), R (T, N), recompute seconds), or None (fewer than three blocks, nothing fits, or
    ``deadline``, a `time.perf_counter` value, passed).  See the module docstring."""
    from monet.schedule import ancestors

    recompute_s = np.asarray(recompute_s, dtype=float)
    blocks = articulation_blocks(graph, mem)
    K = len(blocks)
    if K < 3:
        return None
    T = len(graph.bwd)
    step = float(budget) / LEVELS
    inputs = [tuple(n.fwd_inputs) for n in graph.fwd]
    anc = ancestors(graph)
    lv = lambda b: int(np.ceil(b / step))  # noqa: E731 - bytes -> memory levels, rounded up
    base = np.zeros(K, dtype=int)
    for k, blk in enumerate(blocks):
        if blk.stages is not None:
            a, b = blk.stages
            base[k] = lv(float(np.max(mem.bwd_const[a:b + 1] + mem.bwd_extra[a:b + 1])))
    opts = [_block_options(graph, mem, blk, recompute_s, inputs) for blk in blocks]
    full = np.array([sum(recompute_s[i] for i in range(blk.lo, blk.hi + 1)) for blk in blocks])
    chain = np.array([_chain_seconds(graph, blk, recompute_s, anc) for blk in blocks])
    ckpt = np.array([lv(mem.saved_bytes[mem.group_node == blk.hi].sum()) for blk in blocks])
    caps = np.arange(LEVELS + 1)
    INF = np.inf

    def shifted(arr, w):
        """arr[m - w] for every capacity m (inf where m < w)."""
        out = np.full(LEVELS + 1, INF)
        if w <= LEVELS:
            out[w:] = arr[:LEVELS + 1 - w]
        return out

    def stored(b, rest):
        """Candidates 'store block b with option o' (blocks are 0-based: b = s + 1): (cost, code)."""
        for o, opt in enumerate(opts[b]):
            w = lv(opt.bytes)
            c = opt.seconds + (shifted(rest, w) if rest is not None else 0.0)
            yield np.where(caps >= w + base[b], c, INF), o

    # opt[(s, t)]: blocks s+1..t (s = -1: from the graph's input) with their forward recomputed;
    # top[s]: blocks s+1..K-1 whose forward pass is the first one (not counted)
    opt: dict = {}
    how: dict = {}
    for length in range(1, K + 1):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        for s in range(-1, K - length):
            t = s + length
            best, code = None, None
            for c, o in stored(s + 1, opt[(s + 1, t)] if t > s + 1 else None):
                c = c + full[s + 1]
                best, code = _take(best, code, c, o)
            for j in range(s + 1, t):
                c = chain[s + 1:j + 1].sum() + shifted(opt[(j, t)], ckpt[j]) + opt[(s, j)]
                best, code = _take(best, code, c, 1000 + j)
            opt[(s, t)], how[(s, t)] = best, code
    top: dict = {K - 1: None}
    for s in range(K - 2, -2, -1):
        best, code = None, None
        for c, o in stored(s + 1, top[s + 1]):
            best, code = _take(best, code, c, o)
        for j in range(s + 1, K - 1):
            c = shifted(top[j], ckpt[j]) + opt[(s, j)]
            best, code = _take(best, code, c, 1000 + j)
        top[s], how[("top", s)] = best, code

    starts = [blk.stages[0] if blk.stages is not None else 0 for blk in blocks]

    def keep_at(m: int) -> np.ndarray | None:
        """The keep matrix (T, G) of the DP's schedule with m memory levels, or None."""
        if not np.isfinite(top[-1][m]):
            return None
        keep = np.zeros((T, len(mem.groups)), dtype=bool)
        work = [(-1, K - 1, m, 0, True)]
        while work:
            s, t, m, start, first = work.pop()
            code = int(how[("top", s) if first else (s, t)][m])
            if code < 1000:
                o = opts[s + 1][code]
                keep[start:, o.groups] = True
                if s + 1 < t:
                    work.append((s + 1, t, m - lv(o.bytes), start, first))
            else:
                j = code - 1000
                keep[start:, mem.group_node == blocks[j].hi] = True
                work.append((j, t, m - ckpt[j], start, first))
                work.append((s, j, m, starts[j], False))
        return keep

    def fitted(m: int):
        keep = keep_at(m)
        if keep is None:
            return None
        S, R = repair(graph, mem, keep & allow_s, allow_s)
        return (S, R) if mem.peak(S, R) <= budget else None

    # the largest memory level whose schedule fits in the ILP's exact memory (bisection: the DP's
    # memory is an estimate), then the cheapest of a few levels below it
    finite = np.flatnonzero(np.isfinite(top[-1]))
    if not len(finite):
        return None
    lo, hi, found = int(finite[0]), LEVELS, None
    while lo <= hi:
        if deadline is not None and time.perf_counter() > deadline:
            break
        mid = (lo + hi) // 2
        got = fitted(mid)
        if got is not None:
            found, lo = got, mid + 1
        else:
            hi = mid - 1
    if found is None:
        return None
    S, R = found
    return S, R, float(recompute_s @ R.sum(axis=0))


def _take(best, code, cand, tag):
    """Element-wise minimum of ``best`` and ``cand`` (arrays over memory levels), with the codes."""
    cand = np.broadcast_to(np.asarray(cand, dtype=float), (LEVELS + 1,))
    if best is None:
        return cand.copy(), np.full(LEVELS + 1, tag)
    better = cand < best
    return np.where(better, cand, best), np.where(better, tag, code)
