"""The memory terms of the ILP, as arrays (MONeT, Shah et al. ICLR 2021, Sec. 4 "memory constraints").

All quantities are bytes.  With N forward nodes and T backward stages:

* **Forward pass** (stage 0 of the paper, every node computed in order).  While forward node k runs,
  the live bytes are: the constants, the values produced before k that a later forward node or a
  forward output still reads, the values of kept nodes (``S[0, i] = 1``) that nothing in the forward
  reads any more, and node k's outputs and workspace.  This is exact: the executor frees a value
  after its last use unless it is kept.  Written ``fwd_const[k] + fwd_keep[k] @ S[0] <= budget``.
* **Groups.**  A forward node's kept values form up to two groups: those a backward node reads
  and those only recomputations read (BatchNorm's output is read by the next ReLU only; its
  batch statistics by its backward node).  S is indexed by group, so keeping the statistics does
  not count the output.
* **Backward stage t.**  The constants, the caller's outputs, the backward values live at the start
  of the stage (``bwd_live[t]``, gradients: independent of the schedule), the kept values
  ``saved_bytes @ S[t]`` (S over groups), the values recomputed in the stage ``out_bytes @ R[t]``, and the larger of
  the backward node's outputs plus workspace and each recomputation's workspace.  Recomputed
  values are counted until the end of the stage although the executor frees them after their last
  use, and kept values until the stage that drops them although the executor frees them after
  their last read: the expression is an upper bound of the simulator's peak, so a schedule that
  satisfies it fits the budget (tested in tests/test_memory_model.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from monet.graph import OpGraph


@dataclass
class MemoryModel:
    """Coefficients of the ILP's memory constraints (bytes); see the module docstring.

    Attributes:
        fwd_const: (N,) bytes live while forward node k runs that do not depend on S.
        fwd_keep: (N, G) fwd_keep[k, g] = bytes of group g live while node k runs only if kept.
        groups: (G,) list of value-name tuples; ``group_node[g]`` its forward node, ``group_of``
            value name -> group index.
        bwd_const: (T,) constants + outputs + backward values live at stage t.
        bwd_extra: (T,) outputs + workspace of backward node t.
        saved_bytes: (G,) bytes a kept group holds.
        out_bytes: (N,) bytes a recomputed forward node allocates.
        fwd_workspace: (N,) workspace of each forward node when recomputed.
        constant: parameters + buffers + input + output gradient.
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

    def fwd_peak(self, keep: np.ndarray) -> float:
        """Peak of the forward pass for a keep vector (G,) of 0/1 over groups."""
        return float(np.max(self.fwd_const + self.fwd_keep @ np.asarray(keep, dtype=float)))

    def bwd_peaks(self, S: np.ndarray, R: np.ndarray) -> np.ndarray:
        """(T,) upper bound of each backward stage's peak for 0/1 matrices S (T, G) and R (T, N)."""
        S = np.asarray(S, dtype=float)
        R = np.asarray(R, dtype=float)
        work = np.maximum(self.bwd_extra, (R * self.fwd_workspace[None, :]).max(axis=1))
        return self.bwd_const + S @ self.saved_bytes + R @ self.out_bytes + work

    def peak(self, S: np.ndarray, R: np.ndarray) -> float:
        """The ILP's peak for a schedule: max of the forward and every backward stage (bytes)."""
        return max(self.fwd_peak(np.asarray(S)[0]), float(self.bwd_peaks(S, R).max()))


def build_memory_model(graph: OpGraph, fwd_workspace=None, bwd_workspace=None) -> MemoryModel:
    """The `MemoryModel` of a graph, with per-node workspace in bytes (None = zero)."""
    joint = graph.joint
    N, T = len(graph.fwd), len(graph.bwd)
    fws = np.zeros(N) if fwd_workspace is None else np.maximum(np.asarray(fwd_workspace, dtype=float), 0)
    bws = np.zeros(T) if bwd_workspace is None else np.maximum(np.asarray(bwd_workspace, dtype=float), 0)
    root = graph.alias_root
    fwd_main = {n.name: n.id for n in graph.fwd}
    bwd_main = {n.name: n.id for n in graph.bwd}

    # last forward reader (forward node id; N = a forward output) and last backward reader of every value
    last_f: dict[str, int] = {}
    last_b: dict[str, int] = {}
    out_node = next(n for n in joint.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    for n in joint.graph.nodes:
        if n.op == "call_function" and (n.name in fwd_main or n.name in bwd_main):
            for a in n.all_input_nodes:
                r = root.get(a.name, a.name)
                if n.name in fwd_main:
                    last_f[r] = max(last_f.get(r, -1), fwd_main[n.name])
                else:
                    last_b[r] = max(last_b.get(r, -1), bwd_main[n.name])
    for o in outs[:graph.num_fwd_outputs]:
        if o is not None:
            last_f[root.get(o.name, o.name)] = N
    for o in outs[graph.num_fwd_outputs:]:
        if o is not None:
            last_b[root.get(o.name, o.name)] = T

    groups, group_node, group_of = [], [], {}
    for node in graph.fwd:
        bwd_read = [v for v in node.saved if v in set(node.bwd_read)]
        only_fwd = [v for v in node.saved if v not in set(node.bwd_read)]
        for vals in (bwd_read, only_fwd):
            if vals:
                for v in vals:
                    group_of[v] = len(groups)
                groups.append(tuple(vals))
                group_node.append(node.id)
    G = len(groups)
    constant = graph.param_bytes + graph.buffer_bytes + graph.input_bytes + graph.tangent_bytes
    fwd_const = np.zeros(N)
    fwd_keep = np.zeros((N, G))
    for node in graph.fwd:
        for v in node.outputs:
            b = graph.values[v].nbytes
            last = last_f.get(v, node.id)
            # live at k in (node.id, last]; kept values beyond that if their group is kept
            fwd_const[node.id + 1:last + 1] += b
            if v in group_of:
                fwd_keep[last + 1:, group_of[v]] += b
        fwd_const[node.id] += node.out_bytes + fws[node.id]
    fwd_const += constant

    bwd_live = np.zeros(T)
    for node in graph.bwd:
        for v in node.outputs:
            last = last_b.get(v, node.id)
            bwd_live[node.id + 1:last + 1] += graph.values[v].nbytes
    bwd_const = constant + graph.output_bytes + bwd_live
    bwd_extra = np.array([n.out_bytes for n in graph.bwd], dtype=float) + bws
    return MemoryModel(fwd_const=fwd_const, fwd_keep=fwd_keep, bwd_const=bwd_const, bwd_extra=bwd_extra,
                       saved_bytes=np.array([sum(graph.values[v].nbytes for v in g) for g in groups], dtype=float),
                       out_bytes=np.array([n.out_bytes for n in graph.fwd], dtype=float),
                       fwd_workspace=fws, constant=constant, groups=groups,
                       group_node=np.array(group_node, dtype=int), group_of=group_of)
