"""Per-node costs: the table the solver reads, the analytic cost model, and the solver's arrays.

A **cost table** is a ``pandas.DataFrame`` with one row per (node, implementation) of an `OpGraph`
(docs/design.md, "Data flow", step 2).  Its columns (`COLUMNS`, dtypes in `DTYPES`):

========================  =====================================================================
``kind``                  ``"fwd"`` or ``"bwd"``
``node``                  the node id (``graph.fwd[i].id`` / ``graph.bwd[t].id``), int
``op``                    the ATen op, e.g. ``"aten.convolution.default"`` (checked against the
                          graph so that a table for another graph is rejected)
``impl``                  the implementation; ``"default"`` is PyTorch's own kernel.  (node, impl)
                          is the key: a node may have several implementations.
``time_s``                seconds to run the node the first time (in the forward or backward pass)
``recompute_s``           seconds to run it again when it is recomputed in the backward pass
``workspace_bytes``       bytes of temporaries: peak bytes while the op runs, minus its inputs
                          (already live) and minus its outputs.  May be negative for an in-place
                          implementation (it frees its input); >= 0 for ``"default"``.
``flops``                 floating-point operations (FLOP) of the node
``bytes_moved``           bytes read and written: tensor inputs + outputs
``source``                ``"analytic"`` or ``"profile:<device name>"``
========================  =====================================================================

`analytic_costs` fills the table from a roofline model (deterministic, no device needed);
`monet.profiling.profiler.profile_costs` measures it.  `costs_for` turns a table into the numpy
arrays the solver consumes, and `validate_costs` checks a table (on creation and when loading).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.fx as fx
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import flop_registry

from monet.graph import Node, OpGraph

__all__ = [
    "COLUMNS",
    "DTYPES",
    "DEFAULT_IMPL",
    "DeviceSpec",
    "CostArrays",
    "analytic_costs",
    "node_flops",
    "node_bytes_moved",
    "is_half_precision",
    "costs_for",
    "validate_costs",
    "make_table",
]

DEFAULT_IMPL = "default"

#: Column order of a cost table.
COLUMNS = ["kind", "node", "op", "impl", "time_s", "recompute_s", "workspace_bytes", "flops",
           "bytes_moved", "source"]
#: Column -> dtype kind: "str", "int" (int64) or "float" (float64).
DTYPES = {"kind": "str", "node": "int", "op": "str", "impl": "str", "time_s": "float",
          "recompute_s": "float", "workspace_bytes": "int", "flops": "int", "bytes_moved": "int",
          "source": "str"}
_KEY = ["kind", "node", "impl"]


# ----------------------------------------------------------------------------------------------
# device model
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSpec:
    """A roofline device model for `analytic_costs`.

    Attributes:
        name: a label, e.g. ``"h100"``.
        flops_per_s: peak arithmetic throughput in FLOP/s (fp32, no tensor cores).
        bytes_per_s: peak memory bandwidth in bytes/s.
        launch_s: fixed cost per op in seconds (kernel launch / dispatch overhead).
        half_flops_per_s: peak throughput of 16-bit (bf16/fp16) matmuls and convolutions in
            FLOP/s (tensor cores), used for ops whose floating-point inputs are all 16-bit
            (mixed precision, `monet.mixed_precision`); None: the same as ``flops_per_s``.

    Use the presets: `cpu_default`, or `named` with one of `PRESETS`' keys
    (``"p100"``, ``"v100"``, ``"a100"``, ``"h100"``, ``"h100-pcie"``, ``"h200"``).
    """

    name: str
    flops_per_s: float
    bytes_per_s: float
    launch_s: float = 5e-6
    half_flops_per_s: float | None = None

    def __post_init__(self):
        for field_name in ("flops_per_s", "bytes_per_s") + (("half_flops_per_s",) if self.half_flops_per_s else ()):
            v = getattr(self, field_name)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"DeviceSpec.{field_name} must be a positive number, got {v!r}")
        if not (np.isfinite(self.launch_s) and self.launch_s >= 0):
            raise ValueError(f"DeviceSpec.launch_s must be >= 0 seconds, got {self.launch_s!r}")

    @classmethod
    def cpu_default(cls) -> "DeviceSpec":
        """A nominal multi-core server CPU: 100 GFLOP/s fp32, 20 GB/s, 10 us per op.

        Not a measurement of any particular CPU: a stand-in that gives matmuls and convolutions
        realistic weight against elementwise ops.  Profile (`profile_costs`) for real numbers.
        """
        return cls("cpu_default", flops_per_s=100e9, bytes_per_s=20e9, launch_s=10e-6)

    @classmethod
    def named(cls, name: str) -> "DeviceSpec":
        """The preset called ``name`` (case-insensitive); ``"cpu"`` is `cpu_default`.

        Raises:
            ValueError: for an unknown name; the message lists the presets.
        """
        key = name.lower()
        if key in ("cpu", "cpu_default"):
            return cls.cpu_default()
        if key not in PRESETS:
            raise ValueError(f"unknown device preset {name!r}; known: cpu_default, {', '.join(sorted(PRESETS))}")
        return PRESETS[key]

    @classmethod
    def p100(cls) -> "DeviceSpec":
        """NVIDIA Tesla P100 16 GB (PCIe): the GPU of MONeT's paper."""
        return PRESETS["p100"]

    @classmethod
    def h100(cls) -> "DeviceSpec":
        """NVIDIA H100 SXM5 80 GB."""
        return PRESETS["h100"]


# Peak fp32 (non-tensor-core) throughput and memory bandwidth from NVIDIA's data sheets:
#   P100 PCIe 16 GB: 9.3 TFLOP/s, 732 GB/s  -- "NVIDIA Tesla P100" data sheet (2016)
#   V100 SXM2:       15.7 TFLOP/s, 900 GB/s -- "NVIDIA Tesla V100 GPU Accelerator" data sheet
#   A100 SXM 80 GB:  19.5 TFLOP/s, 2039 GB/s -- "NVIDIA A100 Tensor Core GPU" data sheet
#   H100 SXM5:       67 TFLOP/s, 3.35 TB/s; H100 PCIe: 51 TFLOP/s, 2.0 TB/s
#                                           -- "NVIDIA H100 Tensor Core GPU" data sheet
#   H200 SXM:        67 TFLOP/s, 4.8 TB/s   -- "NVIDIA H200 Tensor Core GPU" data sheet
# (GB = 1e9 bytes there.)  Launch overhead ~5 us per kernel is a typical measured figure.
# 16-bit peaks, dense (without structured sparsity), same data sheets: P100 18.7 TFLOP/s fp16 (no
# tensor cores); V100 125 (fp16 tensor cores; no bf16); A100 312, H100 SXM5 989, H100 PCIe 756,
# H200 989 (bf16 = fp16 tensor cores).
PRESETS: dict[str, DeviceSpec] = {
    "p100": DeviceSpec("p100", flops_per_s=9.3e12, bytes_per_s=732e9, launch_s=5e-6, half_flops_per_s=18.7e12),
    "v100": DeviceSpec("v100", flops_per_s=15.7e12, bytes_per_s=900e9, launch_s=5e-6, half_flops_per_s=125e12),
    "a100": DeviceSpec("a100", flops_per_s=19.5e12, bytes_per_s=2039e9, launch_s=5e-6, half_flops_per_s=312e12),
    "h100": DeviceSpec("h100", flops_per_s=67e12, bytes_per_s=3.35e12, launch_s=5e-6, half_flops_per_s=989e12),
    "h100-pcie": DeviceSpec("h100-pcie", flops_per_s=51e12, bytes_per_s=2.0e12, launch_s=5e-6,
                            half_flops_per_s=756e12),
    "h200": DeviceSpec("h200", flops_per_s=67e12, bytes_per_s=4.8e12, launch_s=5e-6, half_flops_per_s=989e12),
}


# ----------------------------------------------------------------------------------------------
# analytic model
# ----------------------------------------------------------------------------------------------


def _meta_val(a):
    """An FX argument as the flop formulas expect it: nodes become their traced (fake) values."""
    if isinstance(a, fx.Node):
        return a.meta.get("val")
    return a


def _tensor_leaves(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensor_leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensor_leaves(v)]
    return []


def _elem_bytes(t: torch.Tensor) -> int:
    """Bytes of the elements a tensor (or view) covers: numel * itemsize (not its whole storage)."""
    return int(t.numel()) * int(t.element_size())


# ops without a formula in flop_registry that compute what a registered op computes, with the same
# leading arguments: the CPU flash attention kernels (query, key, value; grad_out first backward)
_FLOP_ALIASES = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: torch.ops.aten._scaled_dot_product_flash_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        torch.ops.aten._scaled_dot_product_flash_attention_backward,
}


def node_flops(fx_node: fx.Node) -> int:
    """FLOP of one joint-graph op, from ``torch.utils.flop_counter``'s formula registry.

    The registry (``flop_registry``, keyed by ``OpOverloadPacket``) holds formulas for matmuls
    (mm, addmm, bmm, baddbmm), convolutions (forward and ``convolution_backward``) and attention
    (the CPU flash kernels through `_FLOP_ALIASES`; a kernel of `monet.impls` may carry its own
    formula, ``_monet_flops``, or name its ATen op, ``_monet_aten``);
    they take the op's arguments and ``out_val`` and read only shapes, so the fake tensors of
    ``meta['val']`` serve.  This is exactly what ``FlopCounterMode`` computes at run time.
    Other ops (elementwise, normalisation, reductions) are not in the registry and count 0:
    their time is bandwidth-bound and comes from `node_bytes_moved`.
    """
    # an implementation's kernel names its formula (monet.impls.attention) or the ATen op it runs
    # (monet.impls.conv)
    formula = getattr(fx_node.target, "_monet_flops", None)
    if formula is None:
        target = getattr(fx_node.target, "_monet_aten", fx_node.target)
        packet = getattr(target, "overloadpacket", None)
        packet = _FLOP_ALIASES.get(packet, packet)
        if packet is None or packet not in flop_registry:
            return 0
        formula = flop_registry[packet]
    args = tree_map(_meta_val, fx_node.args)
    kwargs = tree_map(_meta_val, fx_node.kwargs)
    return int(formula(*args, **kwargs, out_val=fx_node.meta.get("val")))


def is_half_precision(fx_node: fx.Node) -> bool:
    """True when every floating-point tensor the op reads is 16-bit (bf16 or fp16): an op that
    autocast runs in lower precision (its FLOP run at `DeviceSpec.half_flops_per_s`)."""
    floats = [t.dtype for a in fx_node.all_input_nodes for t in _tensor_leaves(a.meta.get("val"))
              if t.dtype.is_floating_point]
    return bool(floats) and all(d in (torch.bfloat16, torch.float16) for d in floats)


def node_bytes_moved(fx_node: fx.Node) -> int:
    """Bytes read and written by one op: its tensor arguments plus its outputs, from shapes and
    dtypes (numel * itemsize of each, so a view counts the elements it covers)."""
    ins = [t for a in fx_node.all_input_nodes for t in _tensor_leaves(a.meta.get("val"))]
    outs = _tensor_leaves(fx_node.meta.get("val"))
    return sum(_elem_bytes(t) for t in ins) + sum(_elem_bytes(t) for t in outs)


def make_table(rows: list[dict]) -> pd.DataFrame:
    """A cost table from row dicts (keys `COLUMNS`), with the canonical column order and dtypes.

    Raises:
        ValueError: see `validate_costs`.
    """
    return validate_costs(pd.DataFrame(rows, columns=COLUMNS))


def analytic_costs(graph: OpGraph, spec: DeviceSpec = DeviceSpec.cpu_default()) -> pd.DataFrame:
    """Roofline costs of every node of ``graph``, one row per node with ``impl == "default"``.

    For each node: ``flops`` from `node_flops`, ``bytes_moved`` from `node_bytes_moved` (from the
    traced dtypes: a bf16 tensor moves 2 bytes per element), and
    ``time_s = recompute_s = max(flops / spec.flops_per_s, bytes_moved / spec.bytes_per_s)
    + spec.launch_s`` (seconds), with ``spec.half_flops_per_s`` instead of ``spec.flops_per_s``
    (when given) for an op whose floating-point inputs are all 16-bit (`is_half_precision`).  ``workspace_bytes`` is 0: temporaries are a property of the
    kernel, not of the op's shapes, and only `monet.profiling.profiler.profile_costs` measures
    them.  ``source`` is ``"analytic"``.

    Deterministic: the same graph and spec give the same table (tests and the solver rely on it).

    Args:
        graph: a captured graph (needs ``graph.joint`` for the traced shapes).
        spec: the device model (frozen, so the default instance is safe to share).

    Returns:
        The cost table (see the module docstring): forward nodes in id order, then backward nodes.

    Raises:
        ValueError: if ``graph.joint`` is missing (a graph loaded from a solution file).
    """
    if graph.joint is None:
        raise ValueError("analytic_costs needs the traced joint graph (graph.joint is None); re-capture the model")
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    rows = []
    for node in list(graph.fwd) + list(graph.bwd):
        fx_node = by_name[node.name]
        flops = node_flops(fx_node)
        nbytes = node_bytes_moved(fx_node)
        rate = spec.half_flops_per_s if spec.half_flops_per_s and flops and is_half_precision(fx_node) \
            else spec.flops_per_s
        t = max(flops / rate, nbytes / spec.bytes_per_s) + spec.launch_s
        rows.append(dict(kind=node.kind, node=node.id, op=node.op, impl=DEFAULT_IMPL, time_s=t,
                         recompute_s=t, workspace_bytes=0, flops=flops, bytes_moved=nbytes,
                         source="analytic"))
    return make_table(rows)


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


def validate_costs(table: pd.DataFrame, where: str = "cost table") -> pd.DataFrame:
    """Check a cost table and return it with the canonical column order and dtypes.

    Checks: every column of `COLUMNS` present; ``node``, ``workspace_bytes``, ``flops``,
    ``bytes_moved`` integral; ``time_s``, ``recompute_s`` finite and >= 0 (seconds);
    ``flops``, ``bytes_moved``, ``node`` >= 0; ``kind`` in {"fwd", "bwd"}; no missing values;
    no duplicate (kind, node, impl).  Extra columns are dropped.

    Args:
        table: the table to check (not modified).
        where: what to call it in error messages (e.g. the file it came from).

    Returns:
        A new DataFrame: columns `COLUMNS`, str / int64 / float64 as in `DTYPES`, index 0..n-1.

    Raises:
        ValueError: naming ``where`` and what is wrong.
    """
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"{where}: expected a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{where}: missing columns {missing} (a cost table has {COLUMNS})")
    out = table.loc[:, COLUMNS].copy().reset_index(drop=True)
    nulls = [c for c in COLUMNS if out[c].isna().any()]
    if nulls:
        raise ValueError(f"{where}: missing values in columns {nulls}")
    for col, kind in DTYPES.items():
        if kind == "str":
            out[col] = out[col].astype(str)
            continue
        try:
            values = pd.to_numeric(out[col], errors="raise")
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: column {col!r} is not numeric ({e})") from None
        if kind == "int":
            fvals = values.astype("float64")
            if not np.all(np.isfinite(fvals)) or not np.all(fvals == np.round(fvals)):
                bad = out.loc[~(np.isfinite(fvals) & (fvals == np.round(fvals))), col].iloc[0]
                raise ValueError(f"{where}: column {col!r} must hold integers, found {bad!r}")
            out[col] = values.astype("int64")
        else:
            out[col] = values.astype("float64")
            if not np.all(np.isfinite(out[col])) or (out[col] < 0).any():
                bad = out.loc[~np.isfinite(out[col]) | (out[col] < 0), col].iloc[0]
                raise ValueError(f"{where}: column {col!r} must be finite and >= 0 seconds, found {bad!r}")
    for col in ("node", "flops", "bytes_moved"):
        if (out[col] < 0).any():
            raise ValueError(f"{where}: column {col!r} has negative values")
    bad_kind = sorted(set(out["kind"]) - {"fwd", "bwd"})
    if bad_kind:
        raise ValueError(f"{where}: column 'kind' must be 'fwd' or 'bwd', found {bad_kind}")
    dup = out.duplicated(_KEY, keep=False)
    if dup.any():
        first = out.loc[dup, _KEY].iloc[0].tolist()
        raise ValueError(f"{where}: duplicate rows for (kind, node, impl) = {tuple(first)}")
    return out


# ----------------------------------------------------------------------------------------------
# arrays for the solver
# ----------------------------------------------------------------------------------------------


@dataclass
class CostArrays:
    """The costs the solver uses, for implementation ``impl``, in node-id order.

    Attributes (N forward nodes, T backward nodes):
        fwd_time: (N,) float64 seconds, forward node i in the forward pass.
        fwd_recompute: (N,) float64 seconds, forward node i recomputed in the backward pass.
        fwd_workspace: (N,) int64 bytes of temporaries of forward node i.
        bwd_time: (T,) float64 seconds of backward node t.
        bwd_workspace: (T,) int64 bytes of temporaries of backward node t.
        impl: the implementation these are for.
        source: the table's ``source`` values, e.g. ``("analytic",)``.
        plain_time_s: a measured plain-PyTorch iteration (seconds), the reference of the predicted
            overhead, where it differs from the nodes' sum (on the CPU the nodes carry the
            executor's own time, `monet.profiling.dispatch`); None: the nodes' sum.
    """

    fwd_time: np.ndarray
    fwd_recompute: np.ndarray
    fwd_workspace: np.ndarray
    bwd_time: np.ndarray
    bwd_workspace: np.ndarray
    impl: str = DEFAULT_IMPL
    source: tuple[str, ...] = ()
    plain_time_s: float | None = None

    @property
    def total_time(self) -> float:
        """Seconds of one training step of the schedule that keeps everything (forward + backward,
        no recomputation): the nodes' sum."""
        return float(self.fwd_time.sum() + self.bwd_time.sum())

    @property
    def plain_time(self) -> float:
        """Seconds of one plain-PyTorch training step: ``plain_time_s`` where measured, else
        `total_time`.  The reference of a schedule's predicted overhead."""
        return self.total_time if self.plain_time_s is None else float(self.plain_time_s)


def _rows_for(nodes: list[Node], table: pd.DataFrame, kind: str, impl: str, where: str) -> pd.DataFrame:
    sub = table[(table["kind"] == kind) & (table["impl"] == impl)].set_index("node")
    ids = [n.id for n in nodes]
    missing = [n for n in nodes if n.id not in sub.index]
    if missing:
        n = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{where} has no row for {kind} node {n.id} ({n.op}, fx name {n.name!r}, "
                         f"impl {impl!r}){more}")
    extra = sorted(set(sub.index) - set(ids))
    if extra:
        raise ValueError(f"{where} has rows for {kind} nodes {extra[:5]} that the graph does not have "
                         f"(it has {len(ids)}): the table was made for another graph")
    sub = sub.loc[ids]
    for n, op in zip(nodes, sub["op"]):
        if op != n.op:
            raise ValueError(f"{where}: {kind} node {n.id} is {op!r} in the table but {n.op!r} in the graph: "
                             f"the table was made for another graph")
    return sub


def costs_for(graph: OpGraph, table: pd.DataFrame, impl: str = DEFAULT_IMPL,
              where: str = "cost table", plain_time_s: float | None = None) -> CostArrays:
    """The solver's arrays for ``graph`` from a cost table, for implementation ``impl``.

    Args:
        graph: the graph the table should describe.
        table: a cost table (validated here).
        impl: which implementation's rows to use.
        where: name for the table in error messages (e.g. its file).
        plain_time_s: `CostArrays.plain_time_s` (seconds, or None).

    Returns:
        `CostArrays` in node-id order.

    Raises:
        ValueError: if the table is malformed, misses a node of the graph (the message names the
            first missing node: kind, id, op, fx name), has nodes the graph lacks, or disagrees
            with the graph on a node's op.
    """
    table = validate_costs(table, where)
    f = _rows_for(list(graph.fwd), table, "fwd", impl, where)
    b = _rows_for(list(graph.bwd), table, "bwd", impl, where)
    return CostArrays(
        fwd_time=f["time_s"].to_numpy(dtype=np.float64),
        fwd_recompute=f["recompute_s"].to_numpy(dtype=np.float64),
        fwd_workspace=f["workspace_bytes"].to_numpy(dtype=np.int64),
        bwd_time=b["time_s"].to_numpy(dtype=np.float64),
        bwd_workspace=b["workspace_bytes"].to_numpy(dtype=np.int64),
        impl=impl,
        source=tuple(sorted(set(f["source"]) | set(b["source"]))),
        plain_time_s=None if plain_time_s is None else float(plain_time_s),
    )
