"""Hand-built joint graphs for solver tests: chains, diamonds and repeated blocks, no capture.

A graph is written as its forward and backward nodes, each with the values it reads and the bytes
it allocates; `joint_graph` lays them out as the AOTAutograd joint graph a capture would give
(placeholders ``primals_*`` and ``tangents_1``, the forward ops, the backward ops, one output) with
meta-device tensors of those sizes, and `monet.graph.build_opgraph` turns that into the `OpGraph`
the solver reads.  Nothing runs: the memory model and the simulator read only the traced sizes, so
the ops are placeholders (``aten.sin`` for one input, ``aten.mul`` for two, ``aten.addcmul`` for
three) whatever the sizes.  Costs are given per node (`costs_of`), so a test knows every number
the solver sees and can work out the optimum by hand.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx

from monet.graph import OpGraph, build_opgraph
from monet.profiling.costs import CostArrays
from monet.solver.finish import simulated_schedule

_OPS = {1: torch.ops.aten.sin.default, 2: torch.ops.aten.mul.Tensor, 3: torch.ops.aten.addcmul.default}


@dataclass
class Fwd:
    """A forward node: ``name``, the names it reads (``"x"``, ``"w"`` or an earlier forward node),
    its output's bytes, and its seconds (forward and recomputed: the same)."""

    name: str
    reads: tuple[str, ...]
    nbytes: int
    seconds: float = 1e-3


@dataclass
class Bwd:
    """A backward node: the forward values it reads (names), its output's bytes, its seconds.  It
    reads the previous backward node's output too (the first one reads ``tangents_1``)."""

    reads: tuple[str, ...]
    nbytes: int
    seconds: float = 1e-3


def _meta(nbytes: int) -> torch.Tensor:
    if nbytes % 4:
        raise ValueError(f"sizes are float32 tensors: {nbytes} bytes is not a multiple of 4")
    return torch.empty(nbytes // 4, dtype=torch.float32, device="meta")


def joint_graph(fwd: list[Fwd], bwd: list[Bwd], x_bytes: int = 4, w_bytes: int = 4) -> OpGraph:
    """The `OpGraph` of a joint graph with input ``x`` (``x_bytes``), one parameter ``w``
    (``w_bytes``), the forward nodes ``fwd`` in order (the last is the forward output) and the
    backward nodes ``bwd`` in execution order (the last one's output is ``w``'s gradient).

    Raises:
        ValueError: a read of a name not defined before it, or a size not a multiple of 4."""
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    for name, nbytes in (("primals_1", w_bytes), ("primals_2", x_bytes)):
        env[name] = g.placeholder(name)
        env[name].meta["val"] = _meta(nbytes)
    env["w"], env["x"] = env["primals_1"], env["primals_2"]
    tangent = g.placeholder("tangents_1")
    tangent.meta["val"] = _meta(fwd[-1].nbytes)

    def call(reads, nbytes, name=None):
        try:
            args = tuple(env[r] for r in reads)
        except KeyError as e:
            raise ValueError(f"{name or 'a backward node'} reads {e.args[0]!r}, not defined before it") from None
        node = g.call_function(_OPS[len(args)], args)
        node.meta["val"] = _meta(nbytes)
        return node

    for f in fwd:
        env[f.name] = call(f.reads, f.nbytes, f.name)
    grad = tangent
    for b in bwd:
        env["_grad"] = grad
        grad = call(("_grad",) + tuple(b.reads), b.nbytes)
    g.output((env[fwd[-1].name], grad))
    joint = fx.GraphModule(torch.nn.Module(), g)
    return build_opgraph(joint, 1, {"primals_1": "param", "primals_2": "input"})


def costs_of(fwd: list[Fwd], bwd: list[Bwd]) -> CostArrays:
    """The `CostArrays` of the nodes' own seconds, no workspace."""
    f = np.array([n.seconds for n in fwd], dtype=float)
    b = np.array([n.seconds for n in bwd], dtype=float)
    return CostArrays(fwd_time=f, fwd_recompute=f.copy(), fwd_workspace=np.zeros(len(fwd), dtype=np.int64),
                      bwd_time=b, bwd_workspace=np.zeros(len(bwd), dtype=np.int64), source=("synthetic",))


def chain(sizes: list[int], seconds: list[float]) -> tuple[list[Fwd], list[Bwd]]:
    """A chain ``x -> a0 -> a1 -> ...`` whose backward node for ``a_k`` reads ``a_{k-1}`` (the
    first reads ``x`` and ``w``), as a chain of elementwise ops' gradients does: every forward value
    but the output is read by exactly one backward node."""
    names = [f"a{k}" for k in range(len(sizes))]
    fwd = [Fwd(names[0], ("x", "w"), sizes[0], seconds[0])]
    fwd += [Fwd(names[k], (names[k - 1],), sizes[k], seconds[k]) for k in range(1, len(sizes))]
    bwd = [Bwd((names[k - 1],), sizes[k - 1]) for k in range(len(sizes) - 1, 0, -1)]
    bwd.append(Bwd(("x",), 4))
    return fwd, bwd


def diamond(seconds: tuple[float, float, float] = (1e-3, 5e-3, 1e-3)) -> tuple[list[Fwd], list[Bwd]]:
    """``x, w -> a (4000 B) -> b (400 B), c (4000 B) -> d (40 B, the output)``; the backward reads
    ``c``, then ``b``, then ``a`` twice; every gradient is 40 bytes.  ``seconds``: of a, b, c."""
    fwd = [Fwd("a", ("x", "w"), 4000, seconds[0]), Fwd("b", ("a",), 400, seconds[1]),
           Fwd("c", ("a",), 4000, seconds[2]), Fwd("d", ("b", "c"), 40)]
    bwd = [Bwd(("c",), 40), Bwd(("b",), 40), Bwd(("a",), 40), Bwd(("a",), 40), Bwd(("x",), 40)]
    return fwd, bwd


def blocks(k: int, cheap_s: float = 1e-3, dear_s: float = 5e-3) -> tuple[list[Fwd], list[Bwd]]:
    """``k`` repeated blocks ``q_{j-1} -> p_j (4000 B, cheap_s) -> q_j (400 B, dear_s)`` (``q_0`` is
    ``x``); block j's backward reads ``p_j``, then ``q_{j-1}``, last block first; every gradient
    is 40 bytes, and the output is ``q_k``."""
    fwd, bwd = [], []
    for j in range(1, k + 1):
        before = "x" if j == 1 else f"q{j - 1}"
        fwd += [Fwd(f"p{j}", (before, "w") if j == 1 else (before,), 4000, cheap_s),
                Fwd(f"q{j}", (f"p{j}",), 400, dear_s)]
    for j in range(k, 0, -1):
        bwd += [Bwd((f"p{j}",), 40), Bwd(("x" if j == 1 else f"q{j - 1}",), 40)]
    return fwd, bwd


def dropping(graph: OpGraph, dropped: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(S, R) (T, N) bool of the schedule that keeps every forward value but those of the nodes
    ``dropped`` and recomputes each of those in every backward stage that reads it (from kept
    inputs: a dropped node's inputs must not be dropped too)."""
    S = np.ones((len(graph.bwd), len(graph.fwd)), dtype=bool)
    R = np.zeros_like(S)
    for i in dropped:
        S[:, i] = False
        for t, reads in enumerate(graph.bwd_reads):
            R[t, i] = i in reads
    return S, R


def simulated_peak(graph: OpGraph, costs: CostArrays, S, R) -> int:
    """The simulator's peak (bytes) of the schedule (S, R) (`monet.simulate.schedule_peak`)."""
    return simulated_schedule(graph, costs, np.asarray(S), np.asarray(R), ())[1].peak_bytes
