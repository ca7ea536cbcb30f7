"""Running an FX module node by node inside a memory probe (`ProbedInterpreter`): the CPU probe
(a profiler scope per node) and the CUDA one (the caching allocator's counters), and the device
a trace records (`device_info`).  See `monet.profiling.trace` for how a trace uses them."""
from __future__ import annotations

import os

import torch
import torch.fx as fx

from monet import compat
from monet.graph import op_name
from monet.profiling.trace_format import ENV_KEYS, SCOPE


# ----------------------------------------------------------------------------------------------
# running a module node by node
# ----------------------------------------------------------------------------------------------


class ProbedInterpreter(fx.Interpreter):
    """Runs an FX module node by node, each ``call_function`` node inside ``probe.enter`` /
    ``probe.exit``, freeing inside the probe the values whose last use the node is, and the node's
    output when nothing reads it (what FX's generated code frees, at the same points).

    Args:
        gm: the forward or backward module.
        pass_: "forward" or "backward", passed to the probe.
        probe: ``enter(pass_, node) -> token`` and ``exit(token)``.
    """

    def __init__(self, gm: fx.GraphModule, pass_: str, probe):
        super().__init__(gm, garbage_collect_values=False)
        self.pass_, self.probe = pass_, probe
        seen: set = set()
        self.last_uses: dict[fx.Node, list[fx.Node]] = {}
        for node in reversed(self.graph.nodes):
            for a in node.all_input_nodes:
                if a not in seen:
                    seen.add(a)
                    self.last_uses.setdefault(node, []).append(a)

    def run_node(self, n: fx.Node):
        if n.op != "call_function":
            return super().run_node(n)
        token = self.probe.enter(self.pass_, n)
        try:
            result = super().run_node(n)
            for a in self.last_uses.get(n, ()):
                self.env.pop(a, None)
            if not n.users:
                result = None
        finally:
            self.probe.exit(token)
        return result

    def boxed(self):
        """The callable AOTAutograd calls (boxed: one list of inputs); the backward's list is
        cleared, so its inputs (the saved tensors) are freed after their last use."""
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        clear = self.pass_ == "backward"

        def run(args):
            env = dict(zip(placeholders, args))
            if clear:
                args.clear()
            try:
                return self.run(initial_env=env, enable_io_processing=False)
            finally:
                self.env = {}

        return compat.boxed_list_function(run)


def _role(pass_: str, n: fx.Node, fwd_of: dict) -> tuple[str, int]:
    tag = n.meta.get("monet")
    if tag is not None:
        kind, i = tag
        role = {"fwd": "recompute", "bwd": "backward", "alias": "view", "offload": "offload"}.get(kind, "other")
        return role, int(i)
    if pass_ == "forward" and n.name in fwd_of:
        return "forward", fwd_of[n.name]
    return "other", -1


class Probe:
    """Collects one row per node run; subclasses measure."""

    def __init__(self):
        self.rows: list[dict] = []
        self.fwd_of: dict = {}

    def _row(self, pass_: str, n: fx.Node) -> dict:
        role, i = _role(pass_, n, self.fwd_of)
        row = dict(row=len(self.rows), pass_=pass_, name=n.name, op=op_name(n), role=role, node_id=i)
        self.rows.append(row)
        return row


class CpuProbe(Probe):
    def enter(self, pass_, n):
        row = self._row(pass_, n)
        rf = torch.profiler.record_function(f"{SCOPE}{row['row']}")
        rf.__enter__()
        return rf

    def exit(self, rf):
        rf.__exit__(None, None, None)


class CudaProbe(Probe):
    def __init__(self, device):
        super().__init__()
        self.device = device
        self.labels = False

    def enter(self, pass_, n):
        row = self._row(pass_, n)
        row["gap_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        row["before_bytes"] = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.labels = compat.cuda_memory_metadata(f"{SCOPE}{row['row']}")
        return row

    def exit(self, row):
        compat.cuda_memory_metadata("")
        row["peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        row["after_bytes"] = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)


# ----------------------------------------------------------------------------------------------
# recording
# ----------------------------------------------------------------------------------------------


def _blas_version() -> str | None:
    """cuBLAS's version from the cuBLAS library the process loaded (``cublasLtGetVersion``), None when
    it cannot be found."""
    import ctypes

    for line in open("/proc/self/maps", encoding="utf-8", errors="replace") if os.path.exists("/proc/self/maps") else ():
        path = line.split()[-1] if line.strip() else ""
        if "libcublasLt.so" in path:
            try:
                return str(ctypes.CDLL(path).cublasLtGetVersion())
            except (OSError, AttributeError):
                return None
    return None


def device_info(device) -> dict:
    """What a trace records of the device: type, name, compute capability, torch / CUDA / cuDNN /
    cuBLAS versions, numerics settings (`monet.compat.numerics`) and the allocator and BLAS
    environment variables that change byte counts."""
    from monet.profiling.profiler import device_name

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    return {"type": dev.type, "name": device_name(dev),
            "capability": list(torch.cuda.get_device_capability(dev)) if cuda else None,
            "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "cublas": _blas_version() if cuda else None, "numerics": compat.numerics(),
            "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ}}
