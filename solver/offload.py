"""Offload to host memory: the third choice of the ILP, besides keep and recompute.

A value the forward pass keeps for the backward pass may instead be copied to (pinned) host memory
after its last forward use and copied back before the backward stage that first reads it, on a
separate copy stream, as PyTorch's ``save_on_cpu`` and torchao's activation offloading do, but
chosen per value by the ILP under the same budget as recomputation.

Decisions (written here once; the ILP, the memory model, the simulator and the executor follow them):

* **Candidates.**  A group g of the memory model (`solver.memory_model`) may be offloaded when it is
  one contiguous storage of one forward node's value, not a forward output, read by a backward node,
  not tied to an implementation option (offload is planned in ``normal`` mode), and holds bytes.
* **Variable.**  ``O[g] = 1``: g is kept from the forward pass but off the device from after
  forward node ``release[g]`` (the device copy lives until that node has run, so the out-copy
  overlaps it) to the start of backward stage ``prefetch[g]`` (the in-copy overlaps stages
  ``prefetch[g] .. first[g] - 1``; ``first[g]`` is the first stage whose backward node reads g).
* **Windows.**  With ``x[g] = bytes / bandwidth`` seconds per copy, ``release[g]`` is the first
  forward node after g's last forward reader by whose end the forward compute since that reader
  covers ``x[g]`` (or the end of the forward pass), and ``prefetch[g]`` the last stage before
  ``first[g]`` from which the backward compute up to ``first[g]`` covers ``x[g]`` (or stage 0).
  Both are constants per g, so the ILP stays linear.
* **Memory.**  Forward rows k > ``release[g]`` and the ``U`` of backward stages t < ``prefetch[g]``
  subtract ``bytes[g] O[g]``; ``O[g] <= S[t, g]`` for t < ``prefetch[g]`` (g stays kept until it is
  back), and ``R[t, j] + O[g] <= 1`` there for j = g's node or a forward reader of it (nothing
  recomputes from, or recomputes, a value that is on the host).
* **Time.**  The exposed transfer time per copy direction is the larger of the sum of the per-value
  exposures ``max(0, x[g] - hidden compute)`` and the aggregate ``sum x[g] - compute of the pass``
  (the copies share one stream): ``Xout >= c_out @ O``, ``Xout >= x @ O - F`` and the same for the
  in-copies with the backward time B; the objective adds ``Xout + Xin``.  Recomputation time that
  would also hide copies is not counted (conservative).
* **Heuristic schedules** (repaired roundings, local search: what answers above `solver.formulation.LARGE`
  variables) take the groups ``allowed`` offloaded wherever the schedule keeps them through their
  off-device window (`OffloadModel.effective`), so the MemoryModel's peaks and the simulator agree
  on what moves; `solver.solve` compares two policies there: the copies that are fully hidden, and
  all candidates.

Off by default (``bandwidth`` None or 0), which is also the CPU setting of `monet.optimize`: the
CPU executor's host store (`monet.offload`) exists to test the schedule, the stages and the
accounting, not to save time.  Bandwidths: `DEFAULT_BANDWIDTHS`; measure one with
`monet.profiling.bandwidth.measure_host_bandwidth`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from monet.graph import OpGraph
from monet.solver.memory_build import last_readers

# Bytes per second, one direction, for the predicted tables; assumptions, not measured here (no GPU in
# the session that wrote them; `monet.profiling.bandwidth.measure_host_bandwidth` measures one).
# PCIe 5.0 x16: 64 GB/s theoretical (63 after 128b/130b encoding); pinned host<->device copies
# reach about 80 % of a link's theoretical rate in CUDA's bandwidthTest, so 50e9.  PCIe 4.0 x16
# (A100 hosts): 32 GB/s theoretical, 25e9.  GH200's NVLink-C2C: 900 GB/s total, 450 GB/s each way
# (NVIDIA's Grace Hopper data sheet); 400e9, about the same fraction of it.
DEFAULT_BANDWIDTHS = {"pcie4": 25e9, "pcie5": 50e9, "nvlink-c2c": 400e9}


@dataclass
class OffloadModel:
    """The offload constants of a graph at one bandwidth (see the module docstring).

    Attributes (G groups of the memory model, N forward nodes, T backward stages):
        bandwidth: bytes per second, each direction.
        candidate: (G,) bool, groups that may be offloaded at all.
        allowed: (G,) bool, the candidates a solve may offload (all of them, or a policy).
        value: (G,) the FX name of each candidate's storage ("" for the others).
        release: (G,) int, the forward node after which the device copy is freed (N: at the end of
            the forward pass).
        first: (G,) int, the first backward stage that reads the group.
        prefetch: (G,) int, the backward stage at whose start the copy back is issued.
        x: (G,) seconds per copy; c_out, c_in: (G,) seconds of each copy not hidden by compute.
        fwd_total, bwd_total: seconds of forward and backward compute (no recomputation).
        nbytes: (G,) bytes of each group.
        readers: (G, N) bool: g's node and its forward readers (recomputing one of them in a stage
            before ``prefetch[g]`` would need g on the device).
        n_fwd, n_bwd: N and T.
    """

    bandwidth: float
    candidate: np.ndarray
    allowed: np.ndarray
    value: list
    release: np.ndarray
    first: np.ndarray
    prefetch: np.ndarray
    x: np.ndarray
    c_out: np.ndarray
    c_in: np.ndarray
    fwd_total: float
    bwd_total: float
    nbytes: np.ndarray
    readers: np.ndarray
    n_fwd: int
    n_bwd: int

    @property
    def n_groups(self) -> int:
        return len(self.candidate)

    def fwd_off(self) -> np.ndarray:
        """(N, G) bytes of g off the device while forward node k runs, if offloaded."""
        k = np.arange(self.n_fwd)[:, None]
        return (k > self.release[None, :]) * self.nbytes[None, :] * self.candidate[None, :]

    def bwd_off(self) -> np.ndarray:
        """(T, G) bytes of g off the device during backward stage t, if offloaded."""
        t = np.arange(self.n_bwd)[:, None]
        return (t < self.prefetch[None, :]) * self.nbytes[None, :] * self.candidate[None, :]

    def effective(self, S: np.ndarray, R: np.ndarray | None = None) -> np.ndarray:
        """(G,) bool: the allowed groups a heuristic schedule offloads: kept (S (T, G)) at the start of
        every stage before their prefetch stage (stage 0 at least), and, in those stages, neither
        recomputed nor read by a recomputation (R (T, N))."""
        S = np.asarray(S) > 0.5
        last = np.maximum(self.prefetch - 1, 0)
        cols = np.arange(self.n_groups)
        out = self.allowed & self.candidate & np.logical_and.accumulate(S, axis=0)[last, cols]
        if R is not None and out.any():
            early = np.logical_or.accumulate(np.asarray(R) > 0.5, axis=0)[last]  # (G, N): R before prefetch
            out &= ~((early & self.readers).any(axis=1) & (self.prefetch > 0))
        return out

    def cost(self, O: np.ndarray) -> float:
        """Seconds of transfer not hidden by compute for the offloaded groups O (G,) 0/1."""
        O = np.asarray(O, dtype=float)
        if not O.any():
            return 0.0
        out = max(float(self.c_out @ O), float(self.x @ O) - self.fwd_total, 0.0)
        back = max(float(self.c_in @ O), float(self.x @ O) - self.bwd_total, 0.0)
        return out + back

    def hidden_policy(self) -> np.ndarray:
        """(G,) bool: candidates whose copies are hidden each way (c_out = c_in = 0), largest first
        while their total transfer fits in the forward and in the backward compute."""
        free = np.flatnonzero(self.candidate & (self.c_out <= 0) & (self.c_in <= 0))
        free = free[np.argsort(-self.nbytes[free], kind="stable")]
        out = np.zeros(self.n_groups, dtype=bool)
        total = 0.0
        for g in free:
            if total + self.x[g] <= min(self.fwd_total, self.bwd_total):
                out[g] = True
                total += self.x[g]
        return out

    def with_allowed(self, allowed: np.ndarray) -> "OffloadModel":
        """A copy whose ``allowed`` is ``allowed & candidate``."""
        import dataclasses

        return dataclasses.replace(self, allowed=np.asarray(allowed, dtype=bool) & self.candidate)

    def trimmed(self, O: np.ndarray, fits, deadline: float | None = None) -> np.ndarray:
        """O (G,) without the offloads whose copies cost time and that ``fits(O) -> bool`` (the
        schedule's peak within its budget) does not need: the largest copies are dropped first,
        while the cost is above 0 and until ``deadline`` (a `time.perf_counter` value).  Heuristic
        schedules offload every allowed value they keep (`effective`); this takes back the copies
        the budget does not need (none when ``fits`` rejects O itself: the schedule then fits only
        by the simulator, not by the ILP's memory that ``fits`` may be)."""
        O = np.asarray(O, dtype=bool).copy()
        if self.cost(O) <= 0 or not fits(O):
            return O
        for g in np.flatnonzero(O)[np.argsort(-self.x[O], kind="stable")]:
            if self.cost(O) <= 0 or (deadline is not None and time.perf_counter() > deadline):
                break
            O[g] = False
            if not fits(O):
                O[g] = True
        return O

    def entries(self, O: np.ndarray) -> tuple[tuple[str, int, int], ...]:
        """The schedule's offload entries (`monet.solution.Schedule.offload`) of O (G,):
        (value, release forward node, prefetch stage), in group order."""
        return tuple((self.value[g], int(self.release[g]), int(self.prefetch[g]))
                     for g in np.flatnonzero(np.asarray(O) > 0.5))


def build_offload_model(graph: OpGraph, mem, fwd_time: np.ndarray, bwd_time: np.ndarray,
                        bandwidth: float) -> OffloadModel:
    """The `OffloadModel` of a graph and its memory model at ``bandwidth`` bytes/s (one direction).

    ``fwd_time`` (N,) and ``bwd_time`` (T,) are the cost model's seconds (`CostArrays`), which hide
    the copies (see the module docstring for the windows).

    Raises:
        ValueError: a bandwidth that is not positive.
    """
    if not bandwidth or bandwidth <= 0:
        raise ValueError(f"offload bandwidth must be a positive number of bytes per second, got {bandwidth!r}")
    N, T, G = len(graph.fwd), len(graph.bwd), len(mem.groups)
    fwd_time = np.asarray(fwd_time, dtype=float)
    bwd_time = np.asarray(bwd_time, dtype=float)
    last_f, _ = last_readers(graph)
    by_group: dict[int, list[str]] = {}
    for v, g in mem.group_of.items():
        by_group.setdefault(g, []).append(v)
    fx_nodes = {n.name: n for n in graph.joint.graph.nodes}
    first = np.full(G, T, dtype=int)
    for t, g, _ in mem.reads:
        first[g] = min(first[g], t)
    candidate = np.zeros(G, dtype=bool)
    value = [""] * G
    nbytes = np.asarray(mem.saved_bytes, dtype=float).copy()
    for g in range(G):
        vs = by_group.get(g, [])
        if len(vs) != 1 or mem.group_option[g] >= 0 or first[g] >= T or nbytes[g] <= 0:
            continue
        v = vs[0]
        val = fx_nodes[v].meta.get("val") if v in fx_nodes else None
        if last_f.get(v, -1) >= N or v not in graph.values or v != graph.alias_root.get(v, v):
            continue
        if not (isinstance(val, torch.Tensor) and val.is_contiguous() and val.numel() > 0):
            continue  # the executor copies the bytes of one contiguous tensor
        candidate[g] = True
        value[g] = v
    x = np.where(candidate, nbytes / float(bandwidth), 0.0)
    release = np.full(G, N, dtype=int)
    prefetch = np.zeros(G, dtype=int)
    c_out = np.zeros(G)
    c_in = np.zeros(G)
    cum_f = np.concatenate([[0.0], np.cumsum(fwd_time)])  # cum_f[k] = time of nodes < k
    cum_b = np.concatenate([[0.0], np.cumsum(bwd_time)])
    for g in np.flatnonzero(candidate):
        last = max(int(last_f.get(value[g], int(mem.group_node[g]))), int(mem.group_node[g]))
        # the first k > last with the compute of last+1 .. k covering the copy
        k = int(np.searchsorted(cum_f, cum_f[last + 1] + x[g] - 1e-15, side="left")) - 1
        k = min(max(k, last + 1), N)
        release[g] = k
        c_out[g] = max(0.0, x[g] - (cum_f[min(k, N - 1) + 1] - cum_f[min(last + 1, N)]))
        f = int(first[g])
        # the last p < f with the backward compute of p .. f - 1 covering the copy
        p = int(np.searchsorted(cum_b, cum_b[f] - x[g] + 1e-15, side="right")) - 1
        p = max(0, min(p, f - 1)) if f > 0 else 0
        prefetch[g] = p
        c_in[g] = max(0.0, x[g] - (cum_b[f] - cum_b[p]))
    # a value released at the end of the forward pass and fetched before stage 0 saves nothing
    candidate &= (release < N - 1) | (prefetch > 0)
    x = np.where(candidate, x, 0.0)
    c_out, c_in = np.where(candidate, c_out, 0.0), np.where(candidate, c_in, 0.0)
    readers = np.zeros((G, N), dtype=bool)
    for g in np.flatnonzero(candidate):
        readers[g, int(mem.group_node[g])] = True
        readers[g, [n.id for n in graph.fwd if value[g] in n.reads]] = True
    return OffloadModel(bandwidth=float(bandwidth), candidate=candidate, allowed=candidate.copy(), value=value,
                         release=release, first=first, prefetch=prefetch, x=x, c_out=c_out, c_in=c_in,
                         fwd_total=float(fwd_time.sum()), bwd_total=float(bwd_time.sum()), nbytes=nbytes,
                         readers=readers, n_fwd=N, n_bwd=T)


def check_offload(mode: str, offload_bandwidth) -> None:
    """Offload is planned in normal mode only: checks a ``mode`` and an ``offload_bandwidth``
    (bytes/s; None or 0: no offload) given together.

    Raises:
        ValueError: a negative bandwidth, or offload with another mode."""
    if offload_bandwidth is not None and offload_bandwidth < 0:
        raise ValueError(f"offload_bandwidth must be bytes per second >= 0 (0 or None: no offload), "
                         f"got {offload_bandwidth!r}")
    if offload_bandwidth and mode not in ("normal", "none"):
        raise ValueError(f"offload to host memory is planned in mode 'normal' only, not {mode!r}: "
                         f"use mode='normal' or offload_bandwidth=None")


