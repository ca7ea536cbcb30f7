"""CBC through its C interface: a MIP start, a wall-clock limit, a gap target, the bound, progress.

cvxpy builds the model and reduces it to standard form (``problem.get_problem_data``); cvxpy's own
CBC call (through cylp's ``CyCbcModel``) cannot pass a starting schedule, reports no bound,
and its time limit is CPU time that preprocessing and root cuts overrun (a 60 s limit ran 117 s
on ResNet-50).  The C interface of the same CBC library that cylp ships (``libCbcSolver``,
``Cbc_C_Interface.h``) takes CBC's command-line parameters, a MIP start and a message callback;
we call it with ctypes and hand the answer back to cvxpy (``problem.unpack_results``), so the
problem's variables hold the values as after ``problem.solve``.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import cvxpy as cp
import cvxpy.settings as s
import numpy as np
from cvxpy.reductions.solvers.conic_solvers.conic_solver import dims_to_solver_dict

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


class CbcUnavailable(RuntimeError):
    """cylp's bundled CBC library (with its C interface) was not found."""


def _library():
    import cylp

    root = os.path.dirname(os.path.dirname(cylp.__file__))
    found = sorted(glob.glob(os.path.join(root, "cylp.libs", "libCbcSolver*")))
    if not found:
        raise CbcUnavailable(f"libCbcSolver was not found next to cylp ({root}/cylp.libs): reinstall cylp, "
                             "or pass --solver HIGHS")
    lib = ctypes.CDLL(found[0])
    lib.Cbc_newModel.restype = ctypes.c_void_p
    for name in ("Cbc_bestSolution", "Cbc_getColSolution"):
        getattr(lib, name).restype = _DOUBLE_P
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    for name in ("Cbc_getObjValue", "Cbc_getBestPossibleObjValue"):
        getattr(lib, name).restype = ctypes.c_double
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    for name in ("Cbc_isProvenOptimal", "Cbc_isProvenInfeasible", "Cbc_numberSavedSolutions"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.Cbc_setParameter.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.Cbc_setMIPStartI.argtypes = [ctypes.c_void_p, ctypes.c_int, _INT_P, _DOUBLE_P]
    lib.Cbc_setInteger.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.Cbc_deleteModel.argtypes = [ctypes.c_void_p]
    lib.Cbc_solve.argtypes = [ctypes.c_void_p]
    lib.Cbc_registerCallBack.argtypes = [ctypes.c_void_p, _CALLBACK]
    lib.Cbc_loadProblem.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, _INT_P, _INT_P, _DOUBLE_P,
                                    _DOUBLE_P, _DOUBLE_P, _DOUBLE_P, _DOUBLE_P, _DOUBLE_P]
    return lib


_LIB = None


def library():
    """The loaded ``libCbcSolver`` (ctypes), loaded once.  Raises `CbcUnavailable`."""
    global _LIB
    if _LIB is None:
        _LIB = _library()
    return _LIB


@dataclass
class MilpOutcome:
    """What one MIP solve gave.  Objective and bound in the model's units (seconds here), without
    cvxpy's constant offset unless ``offset`` is added; ``history`` is (wall s, incumbent, bound)."""

    status: str  # "optimal" | "gap" (stopped at the gap target) | "time_limit" | "infeasible" | "no_integer"
    objective: float | None
    bound: float | None
    solve_time_s: float
    history: list[tuple[float, float | None, float | None]] = field(default_factory=list)


def _dp(a):
    return np.ascontiguousarray(a, dtype=np.float64).ctypes.data_as(_DOUBLE_P)


def _ip(a):
    return np.ascontiguousarray(a, dtype=np.int32).ctypes.data_as(_INT_P)


@contextlib.contextmanager
def _stdout_to(target_fd: int | None):
    """Point file descriptor 1 (where CBC's C code prints its log) at ``target_fd``, or at
    /dev/null when None, for the duration; Python's ``sys.stdout`` is flushed first."""
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY) if target_fd is None else None
    try:
        os.dup2(null if target_fd is None else target_fd, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        if null is not None:
            os.close(null)


def solve_cbc(problem: cp.Problem, *, time_limit: float, gap_abs: float = 0.0,
              start: dict | None = None, progress=None, every_s: float = 5.0,
              params: dict | None = None, verbose: bool = False, shown_offset: float = 0.0) -> MilpOutcome:
    """Solve a cvxpy MILP (minimisation, linear constraints) with CBC's C interface.

    Args:
        time_limit: wall-clock seconds for the whole call.  CBC's clock (``-timeMode elapsed
            -seconds``) does not cover its preprocessing, first LP and root cuts, which overran a
            limit by 10-25 s on ResNet-50 (48,000 variables), so CBC gets 70 % of it.
        gap_abs: stop when incumbent - bound <= this (model units; CBC's ``-allowableGap``).
        start: {cvxpy Variable: values} of a feasible schedule (CBC's MIP start); variables left
            out are computed by CBC.  A start that violates a constraint is dropped by CBC.
        progress: ``progress(str)`` for one line per new incumbent and every ``every_s`` seconds.
            CBC's own log goes to standard error with ``verbose``, else nowhere (file
            descriptor 1 is redirected during the solve, so ``progress`` should not print to
            standard output).
        params: more CBC command-line parameters, e.g. {"passCuts": "5"}.
        shown_offset: added to the objective and bound in progress lines (the constant time).

    Returns:
        `MilpOutcome`; when a solution exists, the problem's variables hold it.

    Raises:
        CbcUnavailable: no CBC library.
    """
    lib = library()
    t0 = time.perf_counter()
    data, chain, inverse = problem.get_problem_data(cp.CBC)
    A = data[s.A].tocsc()
    b = np.asarray(data[s.B], dtype=float)
    c = np.asarray(data[s.C], dtype=float)
    dims = dims_to_solver_dict(data[s.DIMS])
    neq = dims[s.EQ_DIM]
    n, m = len(c), A.shape[0]
    row_lb = np.concatenate([b[:neq], np.full(m - neq, -np.inf)])
    col_lb = np.full(n, -np.inf) if data.get(s.LOWER_BOUNDS) is None else np.array(data[s.LOWER_BOUNDS], float)
    col_ub = np.full(n, np.inf) if data.get(s.UPPER_BOUNDS) is None else np.array(data[s.UPPER_BOUNDS], float)
    ints = np.concatenate([np.asarray(data[s.BOOL_IDX], int), np.asarray(data[s.INT_IDX], int)])
    bools = np.asarray(data[s.BOOL_IDX], int)
    col_lb[bools] = np.maximum(col_lb[bools], 0)
    col_ub[bools] = np.minimum(col_ub[bools], 1)
    offset = float(np.ravel(data.get(s.OFFSET, 0.0))[0]) if data.get(s.OFFSET) is not None else 0.0
    arrays = [A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data.astype(np.float64),
              col_lb, col_ub, c, row_lb, b]  # kept alive while CBC holds pointers
    model = ctypes.c_void_p(lib.Cbc_newModel())
    history: list[tuple[float, float | None, float | None]] = []
    state = {"last": -1e9, "best": None, "bound": None}

    def report(best, bound):
        now = time.perf_counter() - t0
        history.append((now, best, bound))
        if progress is None:
            return
        total = None if best is None else best + offset + shown_offset
        gap = "" if total is None or bound is None else f", gap {100 * max(0.0, best - bound) / max(abs(total), 1e-12):.2f} %"
        add = offset + shown_offset
        progress(f"  {now:6.1f} s  incumbent {'-' if best is None else f'{best + add:.6g}'}"
                 f"  bound {'-' if bound is None else f'{bound + add:.6g}'}{gap}")

    def on_message(_model, msgno, ndouble, dvec, _nint, _ivec, _nchar, _cvec):
        try:
            d = [dvec[i] for i in range(ndouble)]
            if msgno in _MSG_SOLUTION and d:
                state["best"] = d[0] if state["best"] is None else min(state["best"], d[0])
                report(state["best"], state["bound"])
            elif msgno == _MSG_ROOT and len(d) >= 2:
                state["bound"] = d[1]
                report(state["best"], state["bound"])
            elif msgno == _MSG_STATUS and len(d) >= 2:
                best = d[0] if d[0] < 1e49 else None
                state["best"], state["bound"] = best, d[1]
                if time.perf_counter() - state["last"] >= every_s:
                    state["last"] = time.perf_counter()
                    report(best, d[1])
        except Exception:  # never let a Python error cross into C
            pass

    callback = _CALLBACK(on_message)
    try:
        lib.Cbc_loadProblem(model, n, m, _ip(arrays[0]), _ip(arrays[1]), _dp(arrays[2]), _dp(col_lb),
                            _dp(col_ub), _dp(c), _dp(row_lb), _dp(b))
        for j in ints:
            lib.Cbc_setInteger(model, int(j))
        lib.Cbc_registerCallBack(model, callback)
        opts = {"log": "1", "timeMode": "elapsed", "seconds": f"{max(0.7 * time_limit, 0.1):g}", "allowableGap": f"{max(gap_abs, 0.0):.12g}",
                "randomSeed": "1", "randomCbcSeed": "1"}
        opts.update(params or {})
        for key, value in opts.items():
            lib.Cbc_setParameter(model, key.encode(), str(value).encode())
        if start:
            cols = data[s.PARAM_PROB].var_id_to_col
            idx, val = [], []
            for var, v in start.items():
                if var is None or var.id not in cols:
                    continue
                first = cols[var.id]
                idx.append(np.arange(first, first + var.size))
                val.append(np.asarray(v, dtype=float).ravel())
            if idx:
                idx_a, val_a = np.concatenate(idx), np.concatenate(val)
                lib.Cbc_setMIPStartI(model, len(idx_a), _ip(idx_a), _dp(val_a))
        with _stdout_to(2 if verbose else None):
            lib.Cbc_solve(model)
        elapsed = time.perf_counter() - t0
        bound = float(lib.Cbc_getBestPossibleObjValue(model))
        bound = None if not np.isfinite(bound) or abs(bound) >= 1e49 else bound
        sol_p = lib.Cbc_bestSolution(model)
        objective = None
        if sol_p:
            x = np.ctypeslib.as_array(sol_p, shape=(n,)).copy()
            objective = float(c @ x)
            optimal = bool(lib.Cbc_isProvenOptimal(model))
            status = s.OPTIMAL if optimal else s.USER_LIMIT
            with warnings.catch_warnings():  # "Solution may be inaccurate" for a stopped search
                warnings.simplefilter("ignore")
                problem.unpack_results({"status": status, "primal": x, "value": objective}, chain, inverse)
            if optimal:
                kind = "optimal"
            elif bound is not None and objective - bound <= gap_abs * (1 + 1e-9):
                kind = "gap"
            else:
                kind = "time_limit"
        elif lib.Cbc_isProvenInfeasible(model):
            kind = "infeasible"
        else:
            kind = "no_integer"
        if objective is not None and kind == "optimal":
            bound = objective if bound is None else min(bound, objective)
        report(objective, bound)
        return MilpOutcome(status=kind, objective=None if objective is None else objective + offset,
                           bound=None if bound is None else bound + offset, solve_time_s=elapsed, history=history)
    finally:
        lib.Cbc_deleteModel(model)
