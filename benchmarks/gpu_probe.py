"""What the BLAS libraries allocate through PyTorch's caching allocator on this GPU and torch.

`monet.profiling.cuda_bytes.library_workspace_bytes` counts, per thread that runs a matrix product,
one cuBLAS workspace plus, when cuBLASLt does not share it, one cuBLASLt workspace.  Which of the two
this torch release does (unified by default from PR #168175; PR #175879 later fixed how the size was
parsed) is read from the sources, not measured.  This script measures it in a fresh process, each
step's growth of ``torch.cuda.memory_allocated()`` beyond its outputs' blocks:

* ``mm_main``: the first ``a @ b`` in the main thread (cuBLAS),
* ``addmm_main``: then ``torch.addmm(bias, a, b)`` (cuBLASLt's bias epilogue) in the same thread,
* ``mm_thread``: the first ``a @ b`` in a second thread (its own handle, its own workspace),
* ``linear_backward``: a ``Linear``'s backward pass (autograd's device thread),

and prints them as one JSON object (also written to ``--out``), with what the model predicts.
Needs CUDA; a few seconds.  ``python3 benchmarks/gpu_probe.py --out probe.json``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

import torch

from monet.profiling import cuda_bytes as cm


def _allocated() -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def _growth(fn) -> int:
    """Bytes ``fn()`` leaves allocated beyond the blocks of the tensors it returns."""
    before = _allocated()
    out = fn()
    kept = sum(cm.round_size(t.nbytes) for t in (out if isinstance(out, tuple) else (out,)))
    return _allocated() - before - kept


def probe(n: int = 256) -> dict:
    """The measured growths (bytes) of the steps in the module docstring, and the model's terms."""
    dev = "cuda"
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    bias = torch.randn(n, device=dev)
    res = {"mm_main": _growth(lambda: a @ b), "addmm_main": _growth(lambda: torch.addmm(bias, a, b))}
    box = {}
    worker = threading.Thread(target=lambda: box.update(mm_thread=_growth(lambda: a @ b)))
    worker.start()
    worker.join()
    res.update(box)
    lin = torch.nn.Linear(n, n, device=dev)
    x = torch.randn(n, n, device=dev, requires_grad=True)
    y = lin(x)
    before = _allocated()
    y.backward(torch.ones_like(y))
    grads = sum(cm.round_size(t.nbytes) for t in (x.grad, lin.weight.grad, lin.bias.grad))
    res["linear_backward"] = _allocated() - before - grads
    cap = torch.cuda.get_device_capability()
    res["model"] = dict(cublas_per_thread=cm.cublas_workspace_bytes(cap), cublaslt_per_thread=cm.cublaslt_workspace_bytes())
    res["env"] = {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                                                 "TORCH_CUBLASLT_UNIFIED_WORKSPACE", "PYTORCH_CUDA_ALLOC_CONF")}
    res.update(torch=torch.__version__, device=torch.cuda.get_device_name(), capability=list(cap),
               cublas=torch._C._cuda_getCompiledVersion() if hasattr(torch._C, "_cuda_getCompiledVersion") else None)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the JSON object here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    res = probe()
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
