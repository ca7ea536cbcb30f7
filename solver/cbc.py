"""CBC through its C interface: a MIP start, a wall-clock limit, a gap target, the bound, progress.

cvxpy builds the model and reduces it to standard form (``problem.get_problem_data``); cvxpy's own
CBC call (through cylp's ``CyCbcModel``) cannot pass a starting schedule, reports no bound,
and its time limit is CPU time that preprocessing and root cuts overrun (a 60 s limit ran 117 s
on ResNet-50).  The C interface of the same CBC library that cylp ships (``libCbcSolver``,
``Cbc_C_Interface.h``) takes CBC's command-line parameters, a MIP start and a message callback.
It runs in a child process (`monet.solver.cbc_worker`, which says why: a crash inside CBC, and a
hard deadline); the answer is handed back to cvxpy (``problem.unpack_results``), so the problem's
variables hold the values as after ``problem.solve``.
"""
from __future__ import annotations

import glob
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import cvxpy as cp
import cvxpy.settings as s
import numpy as np
from cvxpy.reductions.solvers.conic_solvers.conic_solver import dims_to_solver_dict

from monet.terms import arg


class CbcUnavailable(RuntimeError):
    """cylp's bundled CBC library (with its C interface) was not found."""


def library_path() -> str:
    """Path of the ``libCbcSolver`` that cylp ships.  Raises `CbcUnavailable`."""
    import cylp

    root = os.path.dirname(os.path.dirname(cylp.__file__))
    found = sorted(glob.glob(os.path.join(root, "cylp.libs", "libCbcSolver*")))
    if not found:
        raise CbcUnavailable(f"libCbcSolver was not found next to cylp ({root}/cylp.libs): reinstall cylp, "
                             "or use " + arg('solver="HIGHS"', "--solver HIGHS"))
    return found[0]


@dataclass
class MilpOutcome:
    """What one MIP solve gave.  Objective and bound in the model's units (seconds here), without
    cvxpy's constant offset unless ``offset`` is added; ``history`` is (wall s, incumbent, bound);
    ``detail`` says why a solve ended without an answer (a crash, the hard deadline)."""

    status: str  # "optimal" | "gap" (stopped at the gap target) | "time_limit" | "infeasible" | "no_integer"
    objective: float | None
    bound: float | None
    solve_time_s: float
    history: list[tuple[float, float | None, float | None]] = field(default_factory=list)
    detail: str = ""


def _messages(stream, q: queue.Queue) -> None:
    """Move the child's pickled messages onto ``q``; None at the end of the stream."""
    try:
        while True:
            q.put(pickle.load(stream))
    except Exception:  # EOF, or a message cut off by a crash
        q.put(None)


def _worker_command() -> list[str]:
    """The child process that runs one solve (`monet.solver.cbc_worker`)."""
    return [sys.executable, "-m", "monet.solver.cbc_worker"]


def _start_columns(data: dict, start: dict | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(columns, values) of a MIP start given as {cvxpy Variable: values}, in the columns of the
    problem data ``data``; variables the problem does not have are left out.  (None, None) without."""
    if not start:
        return None, None
    cols = data[s.PARAM_PROB].var_id_to_col
    idx, val = [], []
    for var, v in start.items():
        if var is None or var.id not in cols:
            continue
        first = cols[var.id]
        idx.append(np.arange(first, first + var.size))
        val.append(np.asarray(v, dtype=float).ravel())
    return (np.concatenate(idx), np.concatenate(val)) if idx else (None, None)


def _job(data: dict, lib: str, time_limit: float, gap_abs: float, start: dict | None, params: dict | None,
         every_s: float, verbose: bool) -> dict:
    """What the child process (`monet.solver.cbc_worker`) solves with the CBC library at ``lib``:
    cvxpy's CBC problem data ``data`` as column-major constraint rows with bounds (equalities
    first, then ``<=`` rows), integer columns (booleans bounded to [0, 1]), CBC's parameters (70 %
    of ``time_limit`` on its elapsed-time clock: see `solve_cbc`) and the MIP start's columns."""
    A = data[s.A].tocsc()
    b = np.asarray(data[s.B], dtype=float)
    c = np.asarray(data[s.C], dtype=float)
    neq = dims_to_solver_dict(data[s.DIMS])[s.EQ_DIM]
    n, m = len(c), A.shape[0]
    col_lb = np.full(n, -np.inf) if data.get(s.LOWER_BOUNDS) is None else np.array(data[s.LOWER_BOUNDS], float)
    col_ub = np.full(n, np.inf) if data.get(s.UPPER_BOUNDS) is None else np.array(data[s.UPPER_BOUNDS], float)
    bools = np.asarray(data[s.BOOL_IDX], int)
    col_lb[bools] = np.maximum(col_lb[bools], 0)
    col_ub[bools] = np.minimum(col_ub[bools], 1)
    opts = {"log": "1", "timeMode": "elapsed", "seconds": f"{max(0.7 * time_limit, 0.1):g}",
            "allowableGap": f"{max(gap_abs, 0.0):.12g}", "randomSeed": "1", "randomCbcSeed": "1"}
    opts.update(params or {})
    start_idx, start_val = _start_columns(data, start)
    return {"lib": lib, "n": n, "m": m, "indptr": A.indptr, "indices": A.indices, "data": A.data,
            "col_lb": col_lb, "col_ub": col_ub, "c": c, "row_lb": np.concatenate([b[:neq], np.full(m - neq, -np.inf)]),
            "row_ub": b, "ints": np.concatenate([bools, np.asarray(data[s.INT_IDX], int)]),
            "params": opts, "start_idx": start_idx, "start_val": start_val, "every_s": every_s, "verbose": verbose}


def _reporter(history: list, progress, add: float):
    """``report(now, best, bound)``: appends to ``history``, and tells ``progress`` one line with
    the incumbent and the bound (``add`` added to both: the objective's offset and the shown one)."""
    def report(now, best, bound):
        history.append((now, best, bound))
        if progress is None:
            return
        total = None if best is None else best + add
        gap = "" if total is None or bound is None else f", gap {100 * max(0.0, best - bound) / max(abs(total), 1e-12):.2f} %"
        progress(f"  {now:6.1f} s  incumbent {'-' if best is None else f'{best + add:.6g}'}"
                 f"  bound {'-' if bound is None else f'{bound + add:.6g}'}{gap}")
    return report


def _run_child(job: dict, t0: float, deadline: float, report) -> tuple[tuple | None, str]:
    """Solve ``job`` in a child process, passing its progress messages to ``report``, until it
    answers or ``deadline`` (`time.perf_counter` seconds; ``t0`` when the call began): (its
    ``("done", x, optimal, infeasible, bound)`` message or None, what went wrong)."""
    child = subprocess.Popen(_worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_messages, args=(child.stdout, q), daemon=True).start()
    try:
        pickle.dump(job, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        child.stdin.close()
    except BrokenPipeError:
        pass
    done, detail = None, ""
    while done is None:
        try:
            msg = q.get(timeout=max(0.0, deadline - time.perf_counter()))
        except queue.Empty:
            detail = f"CBC did not answer within {deadline - t0:.0f} s and was stopped"
            break
        if msg is None:
            child.wait()
            detail = f"CBC stopped without an answer (exit status {child.returncode})"
            break
        if msg[0] == "report":
            report(*msg[1:])
        elif msg[0] == "done":
            done = msg
    if child.poll() is None:
        child.kill()
    child.wait()
    return done, detail


def _answer(problem: cp.Problem, done: tuple, c: np.ndarray, chain, inverse, gap_abs: float) \
        -> tuple[str, float | None, float | None]:
    """(status, objective, bound) of the child's answer ``done``, in the model's units less cvxpy's
    offset; a solution is unpacked into ``problem``'s variables."""
    _, x, optimal, infeasible, bound = done
    bound = None if not np.isfinite(bound) or abs(bound) >= 1e49 else bound
    if x is None:
        return ("infeasible" if infeasible else "no_integer"), None, bound
    objective = float(c @ x)
    with warnings.catch_warnings():  # "Solution may be inaccurate" for a stopped search
        warnings.simplefilter("ignore")
        problem.unpack_results({"status": s.OPTIMAL if optimal else s.USER_LIMIT, "primal": x, "value": objective},
                               chain, inverse)
    if optimal:
        return "optimal", objective, objective if bound is None else min(bound, objective)
    if bound is not None and objective - bound <= gap_abs * (1 + 1e-9):
        return "gap", objective, bound
    return "time_limit", objective, bound


def solve_cbc(problem: cp.Problem, *, time_limit: float, gap_abs: float = 0.0,
              start: dict | None = None, progress=None, every_s: float = 5.0,
              params: dict | None = None, verbose: bool = False, shown_offset: float = 0.0) -> MilpOutcome:
    """Solve a cvxpy MILP (minimisation, linear constraints) with CBC's C interface: the problem
    data as CBC takes it (`_job`), solved in a child process (`_run_child`), its answer read back
    (`_answer`).

    Args:
        time_limit: wall-clock seconds for the whole call.  CBC's clock (``-timeMode elapsed
            -seconds``) does not cover its preprocessing, first LP and root cuts, which overran a
            limit by 10-25 s on ResNet-50 (48,000 variables), so CBC gets 70 % of it, and the
            child process is stopped (status "no_integer", see ``detail``) 2 s after the limit:
            its start schedule then stands.
        gap_abs: stop when incumbent - bound <= this (model units; CBC's ``-allowableGap``).
        start: {cvxpy Variable: values} of a feasible schedule (CBC's MIP start); variables left
            out are computed by CBC.  A start that violates a constraint is dropped by CBC.
        progress: ``progress(str)`` for one line per new incumbent and every ``every_s`` seconds.
            CBC's own log goes to standard error with ``verbose``, else nowhere.
        params: more CBC command-line parameters, e.g. {"passCuts": "5"}.
        shown_offset: added to the objective and bound in progress lines (the constant time).

    Returns:
        `MilpOutcome`; when a solution exists, the problem's variables hold it.  A crash of CBC
        is status "no_integer" with ``detail`` naming the exit status, not an exception.

    Raises:
        CbcUnavailable: no CBC library.
    """
    lib = library_path()
    t0 = time.perf_counter()
    data, chain, inverse = problem.get_problem_data(cp.CBC)
    offset = float(np.ravel(data.get(s.OFFSET, 0.0))[0]) if data.get(s.OFFSET) is not None else 0.0
    job = _job(data, lib, time_limit, gap_abs, start, params, every_s, verbose)
    history: list[tuple[float, float | None, float | None]] = []
    report = _reporter(history, progress, offset + shown_offset)
    # CBC's clock (70 % of the limit) misses its preprocessing and its heuristics' sub-searches
    # (a "mini branch and bound" ran 20 s past a 27 s limit on ResNet-50, then gave the only
    # integer schedule): a child that has not answered 2 s after the limit is stopped
    done, detail = _run_child(job, t0, t0 + time_limit + 2.0, report)
    elapsed = time.perf_counter() - t0
    if done is None:
        if progress is not None:
            progress(f"  {detail}; the start schedule stands")
        best = next((h[1] for h in reversed(history) if h[1] is not None), None)
        return MilpOutcome(status="no_integer", objective=None, bound=None, solve_time_s=elapsed,
                           history=history, detail=f"{detail} (its best incumbent: {best})" if best is not None
                           else detail)
    kind, objective, bound = _answer(problem, done, job["c"], chain, inverse, gap_abs)
    report(elapsed, objective, bound)
    return MilpOutcome(status=kind, objective=None if objective is None else objective + offset,
                       bound=None if bound is None else bound + offset, solve_time_s=elapsed, history=history)
