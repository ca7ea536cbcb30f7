"""One CBC solve in a child process: ``python -m monet.solver.cbc_worker`` (started by `solve_cbc`).

Why a process of its own: CBC 2.10.13's C interface (the ``libCbcSolver`` cylp ships) crashed with a
segmentation fault inside ``Cbc_solve`` on ResNet-50 (batch 32, 65 % budget, normal mode, with a
MIP start), which took the whole ``monet solve`` down with it; and CBC's clock does not cover its
preprocessing and root cuts, which overran a 10 s limit by 20 s.  In a child, a crash is a lost
solve (the caller still has its start schedule), and the parent can stop it at a hard deadline.

Protocol: the parent writes one pickled job to standard input::

    {"lib": path of libCbcSolver, "n": columns, "m": rows,
     "indptr", "indices", "data": the constraint matrix A (m, n) in CSC form (int32, int32, float64),
     "col_lb", "col_ub", "c": (n,), "row_lb", "row_ub": (m,), "ints": integer column indices,
     "params": {CBC command-line parameter: value}, "start_idx", "start_val": a MIP start or None,
     "every_s": seconds between periodic progress reports, "verbose": CBC's log to stderr}

and reads pickled tuples from standard output: ``("report", seconds, incumbent, bound)`` as the
search goes, then ``("done", x (n,) or None, proven_optimal, proven_infeasible, bound)``.  CBC's
own log (C code printing to file descriptor 1) goes to standard error with ``verbose``, else to
/dev/null; messages travel on a duplicate of the original descriptor 1.
"""
from __future__ import annotations

import ctypes
import os
import pickle
import sys
import time

import numpy as np

_DOUBLE_P = ctypes.POINTER(ctypes.c_double)
_INT_P = ctypes.POINTER(ctypes.c_int)
# void cbc_callback(Cbc_Model *model, int msgno, int ndouble, const double *dvec, int nint,
#                   const int *ivec, int nchar, char **cvec)
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, _DOUBLE_P, ctypes.c_int,
                             _INT_P, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
# CBC's message numbers (CbcMessage.cpp): a new incumbent, and the periodic search status
_MSG_SOLUTION = {4, 12, 16, 11}  # CBC_SOLUTION, CBC_INTEGERSOLUTION, CBC_ROUNDING, CBC_SOLUTION2
_MSG_STATUS = 10  # "After %d nodes, %d on tree, %g best solution, best possible %g (%.2f seconds)"
_MSG_ROOT = 13  # "At root node, %d cuts changed objective from %g to %g in %d passes"


def load_library(path: str):
    """``libCbcSolver`` at ``path`` (ctypes) with the signatures used here."""
    lib = ctypes.CDLL(path)
    lib.Cbc_newModel.restype = ctypes.c_void_p
    lib.Cbc_bestSolution.restype = _DOUBLE_P
    lib.Cbc_bestSolution.argtypes = [ctypes.c_void_p]
    lib.Cbc_getBestPossibleObjValue.restype = ctypes.c_double
    lib.Cbc_getBestPossibleObjValue.argtypes = [ctypes.c_void_p]
    for name in ("Cbc_isProvenOptimal", "Cbc_isProvenInfeasible", "Cbc_deleteModel", "Cbc_solve"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.Cbc_setParameter.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.Cbc_setMIPStartI.argtypes = [ctypes.c_void_p, ctypes.c_int, _INT_P, _DOUBLE_P]
    lib.Cbc_setInteger.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.Cbc_registerCallBack.argtypes = [ctypes.c_void_p, _CALLBACK]
    lib.Cbc_loadProblem.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, _INT_P, _INT_P, _DOUBLE_P,
                                    _DOUBLE_P, _DOUBLE_P, _DOUBLE_P, _DOUBLE_P, _DOUBLE_P]
    return lib


def _dp(a):
    return a.ctypes.data_as(_DOUBLE_P)


def _ip(a):
    return a.ctypes.data_as(_INT_P)


def run(job: dict, send) -> None:
    """Solve ``job`` (see the module docstring) and ``send`` the messages."""
    lib = load_library(job["lib"])
    t0 = time.perf_counter()
    arrays = {k: np.ascontiguousarray(job[k], dtype=np.int32 if k in ("indptr", "indices") else np.float64)
              for k in ("indptr", "indices", "data", "col_lb", "col_ub", "c", "row_lb", "row_ub")}
    state = {"last": -1e9, "best": None, "bound": None}

    def on_message(_model, msgno, ndouble, dvec, _nint, _ivec, _nchar, _cvec):
        try:
            d = [dvec[i] for i in range(ndouble)]
            if msgno in _MSG_SOLUTION and d:
                state["best"] = d[0] if state["best"] is None else min(state["best"], d[0])
            elif msgno == _MSG_ROOT and len(d) >= 2:
                state["bound"] = d[1]
            elif msgno == _MSG_STATUS and len(d) >= 2:
                state["best"], state["bound"] = (d[0] if d[0] < 1e49 else None), d[1]
                if time.perf_counter() - state["last"] < job["every_s"]:
                    return
                state["last"] = time.perf_counter()
            else:
                return
            send(("report", time.perf_counter() - t0, state["best"], state["bound"]))
        except Exception:  # never let a Python error cross into C
            pass

    callback = _CALLBACK(on_message)
    model = ctypes.c_void_p(lib.Cbc_newModel())
    lib.Cbc_loadProblem(model, int(job["n"]), int(job["m"]), _ip(arrays["indptr"]), _ip(arrays["indices"]),
                        _dp(arrays["data"]), _dp(arrays["col_lb"]), _dp(arrays["col_ub"]), _dp(arrays["c"]),
                        _dp(arrays["row_lb"]), _dp(arrays["row_ub"]))
    for j in job["ints"]:
        lib.Cbc_setInteger(model, int(j))
    lib.Cbc_registerCallBack(model, callback)
    for key, value in job["params"].items():
        lib.Cbc_setParameter(model, str(key).encode(), str(value).encode())
    if job.get("start_idx") is not None and len(job["start_idx"]):
        idx = np.ascontiguousarray(job["start_idx"], dtype=np.int32)
        val = np.ascontiguousarray(job["start_val"], dtype=np.float64)
        lib.Cbc_setMIPStartI(model, len(idx), _ip(idx), _dp(val))
    lib.Cbc_solve(model)
    bound = float(lib.Cbc_getBestPossibleObjValue(model))
    sol_p = lib.Cbc_bestSolution(model)
    x = np.ctypeslib.as_array(sol_p, shape=(int(job["n"]),)).copy() if sol_p else None
    send(("done", x, bool(lib.Cbc_isProvenOptimal(model)), bool(lib.Cbc_isProvenInfeasible(model)), bound))
    lib.Cbc_deleteModel(model)


def main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    job = pickle.load(sys.stdin.buffer)
    # CBC's C code prints its log on descriptor 1: send it to stderr or nowhere
    target = 2 if job.get("verbose") else os.open(os.devnull, os.O_WRONLY)
    os.dup2(target, 1)

    def send(msg):
        pickle.dump(msg, out)
        out.flush()

    run(job, send)
    out.close()


if __name__ == "__main__":
    main()
