"""PuLP's bundled CBC program, several threads: the MILP back-end ``solver="PULP"`` (issue 36).

cylp's CBC (`monet.solver.cbc`) runs branch and bound on one thread.  PuLP ships a CBC program
(``pulp.apis.PULP_CBC_CMD().path``, CBC 2.10.3 in pulp 3.3) built with threads.  The cvxpy
problem reaches it as a file: its standard form (`monet.solver.milp.standard_form`) is written
as free MPS straight from the sparse matrix (`write_mps`; ResNet-50's joint ILP at batch 184,
91,218 columns and 472,157 entries: 1.7 s, where PuLP's own model build and ``writeMPS`` took
3.6 + 3.0 s), a MIP start as CBC's solution file (``-mips``), and the program runs with
``-threads N -timeMode elapsed -sec S``; its log on standard output gives the incumbents and
bounds as they come (`monet.solver.milp.Reporter`), its solution file the answer.

Like `monet.solver.cbc.solve_cbc`, CBC's clock gets 70 % of what is left of the limit after the
file is written (its clock does not cover the root LP: 80 s of wall clock on ResNet-50's joint
ILP with ``-sec 20``); at the limit the program is interrupted (SIGINT: it stops its search and
writes its best solution) and 2 s later killed.
"""
from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import cvxpy as cp
import numpy as np

from monet.solver.milp import MilpOutcome, Reporter, StandardForm, finish, standard_form
from monet.terms import arg

# seconds between the interrupt at the limit and the kill
GRACE_S = 2.0

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_INCUMBENT = re.compile(r"(?:Integer solution of|MIPStart provided solution with cost) " + _NUM)
_STATUS = re.compile(r"Cbc0010I After \d+ nodes, \d+ on tree, " + _NUM + r" best solution, best possible " + _NUM)
_ROOT = re.compile(r"(?:Cbc0013I At root node, .* objective from " + _NUM + " to " + _NUM
                   + r"|Cbc0005I Partial search - best objective " + _NUM + r" \(best possible " + _NUM + r"\))")
_LOWER = re.compile(r"^Lower bound:\s+" + _NUM)


class PulpUnavailable(RuntimeError):
    """pulp (with its bundled CBC program) is not installed or its CBC cannot run here."""


def cbc_program() -> str:
    """Path of the CBC program pulp ships.

    Raises:
        PulpUnavailable: pulp is not installed, or its CBC program is missing or not executable.
    """
    use = arg('solver="CBC"', "--solver CBC")
    try:
        from pulp.apis import PULP_CBC_CMD
    except ImportError as e:
        raise PulpUnavailable(f"solver PULP needs pulp, which is not installed ({e}): pip install pulp, "
                              f"or use {use}") from None
    path = PULP_CBC_CMD().path
    if not path or not os.access(path, os.X_OK):
        raise PulpUnavailable(f"pulp's bundled CBC program was not found or cannot run ({path}): reinstall pulp, "
                              f"or use {use}")
    return path


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity): the threads CBC is given."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def write_mps(path: str, form: StandardForm) -> None:
    """Write ``form`` as an MPS file in the layout PuLP writes (names of at most 8 characters in
    the fixed fields: columns ``C<j>``, rows ``R<i>``, objective ``OBJ``; integer columns between
    MARKER lines; numbers from column 25, here in Python's shortest round-trip form, read back
    exactly): CBC's reader rejected ("Bad image") a line whose short names sat outside those fields.

    Raises:
        ValueError: more than 9,999,999 rows or columns (names longer than 8 characters).
        OSError: the file cannot be written."""
    A, c, n, m = form.A, form.c, form.n, form.m
    if max(n, m) > 10 ** 7:
        raise ValueError(f"{n} columns and {m} rows: MPS names of 8 characters hold at most 9,999,999 of each")
    is_int = np.zeros(n, dtype=bool)
    is_int[form.ints] = True
    rows = [f"R{i:<7}" for i in range(m)]
    # the entries in column order: the objective's coefficient first (also for a column with no
    # other entry, so that every column is declared), then the constraint rows
    counts = np.diff(A.indptr)
    obj_cols = np.flatnonzero((c != 0) | (counts == 0))
    cols = np.concatenate([obj_cols, np.repeat(np.arange(n), counts)])
    order = np.argsort(cols, kind="stable")
    names = ["OBJ     "] * len(obj_cols) + [rows[i] for i in A.indices.tolist()]
    vals = np.concatenate([c[obj_cols], A.data]).tolist()
    cols = cols[order].tolist()
    entries = [f"    C{j:<7}  {names[k]}  {vals[k]!r}" for j, k in zip(cols, order.tolist())]
    # a MARKER pair around each run of integer columns: the marker goes before the first entry
    # of the run's first column (cols is sorted, so that entry is found by bisection)
    runs = np.flatnonzero(np.diff(np.concatenate([[False], is_int, [False]]).astype(int)))
    at = np.searchsorted(cols, runs)
    columns: list[str] = []
    last = 0
    for k, (pos, j) in enumerate(zip(at.tolist(), runs.tolist())):
        columns += entries[last:pos]
        columns.append("    MARK      'MARKER'                 " + ("'INTORG'" if k % 2 == 0 else "'INTEND'"))
        last = pos
    columns += entries[last:]
    out = ["NAME          MONET", "ROWS", " N  OBJ"]
    out += [f" E  {rows[i]}" for i in range(form.n_eq)] + [f" L  {rows[i]}" for i in range(form.n_eq, m)]
    out += ["COLUMNS", *columns, "RHS"]
    nz = np.flatnonzero(form.row_ub != 0)
    out += [f"    RHS       {rows[i]}  {v!r}" for i, v in zip(nz.tolist(), form.row_ub[nz].tolist())]
    out += ["BOUNDS", *_bound_lines(form.col_lb, form.col_ub, is_int), "ENDATA", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def _bound_lines(lb: np.ndarray, ub: np.ndarray, is_int: np.ndarray) -> list[str]:
    """MPS BOUNDS lines; MPS's default is [0, inf) (and binary for a bare integer column under
    CBC), so every other bound is written."""
    out = []
    for j, (lo, up, integer) in enumerate(zip(lb.tolist(), ub.tolist(), is_int.tolist())):
        if integer and lo == 0 and up == 1:
            out.append(f" BV BND       C{j}")
            continue
        if lo == -np.inf and up == np.inf:
            out.append(f" FR BND       C{j}")
            continue
        if lo == -np.inf:
            out.append(f" MI BND       C{j}")
        elif lo != 0 or integer:
            out.append(f" LO BND       C{j:<7}  {lo!r}")
        if up != np.inf:
            out.append(f" UP BND       C{j:<7}  {up!r}")
    return out


def write_start(path: str, form: StandardForm) -> bool:
    """Write ``form``'s MIP start as CBC's solution file (what ``-mips`` reads); False (nothing
    written) when it has none."""
    if form.start_idx is None or not len(form.start_idx):
        return False
    lines = ["Stopped on time - objective value 0"]
    lines += [f"{j} C{j} {v!r} 0" for j, v in zip(form.start_idx.tolist(), form.start_val.tolist())]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return True


def read_solution(path: str, n: int) -> tuple[np.ndarray | None, bool, bool]:
    """CBC's solution file: (x (n,) of its best integer point or None, proven optimal, proven
    infeasible).  A file from a search stopped without an integer point ("no integer solution -
    continuous used") gives no x: its values are the LP's."""
    try:
        with open(path) as f:
            head = f.readline()
            body = f.read().split("\n")
    except OSError:
        return None, False, False
    optimal = head.startswith("Optimal")
    infeasible = head.startswith("Infeasible") or head.startswith("Integer infeasible")
    found = optimal or (head.startswith("Stopped") and "no integer solution" not in head)
    if not found:
        return None, optimal, infeasible
    x = np.zeros(n)
    for line in body:
        tok = line.split()
        if tok and tok[0] == "**":  # CBC marks a row or column outside its bounds
            tok = tok[1:]
        if len(tok) >= 3 and tok[1].startswith("C"):
            x[int(tok[1][1:])] = float(tok[2])
    return x, optimal, infeasible


class PulpCbcRun:
    """One PuLP-CBC solve running in its own process: `start_pulp_cbc` starts it, `result`
    waits for it (until its limit, then interrupts and kills it) and gives the `MilpOutcome`."""

    def __init__(self, problem: cp.Problem, form: StandardForm, report: Reporter, gap_abs: float,
                 deadline: float, t0: float, child: subprocess.Popen, log: io.BufferedReader,
                 workdir: tempfile.TemporaryDirectory, every_s: float, verbose: bool, threads: int, write_s: float):
        self.problem, self.form, self.report, self.gap_abs = problem, form, report, gap_abs
        self.deadline, self.t0, self.child, self.log, self.workdir = deadline, t0, child, log, workdir
        self.every_s, self.verbose, self.threads, self.write_s = every_s, verbose, threads, write_s
        self.final_bound: float | None = None
        self.killed = False
        self.reader = threading.Thread(target=self._read_log, daemon=True)
        self.reader.start()
        self.watchdog = threading.Thread(target=self._watch, daemon=True)
        self.watchdog.start()

    def _watch(self) -> None:
        """At the limit, interrupt the program (SIGINT: CBC stops its search and writes its best
        solution); `GRACE_S` later, kill it.  Runs whether or not `result` is waiting."""
        for signum, until in ((signal.SIGINT, self.deadline), (signal.SIGKILL, self.deadline + GRACE_S)):
            try:
                self.child.wait(timeout=max(0.0, until - time.perf_counter()))
                return
            except subprocess.TimeoutExpired:
                self.killed = signum == signal.SIGKILL
                self.child.send_signal(signum)

    def _read_log(self) -> None:
        """Turn CBC's log into progress points (incumbent, bound), as it comes."""
        best = bound = None
        last = -1e9
        for raw in _lines(self.log):
            line = raw.decode(errors="replace").rstrip()
            if self.verbose:
                print(line, file=sys.stderr)
            m = _LOWER.match(line)
            if m:
                self.final_bound = float(m.group(1))
                continue
            m = _INCUMBENT.search(line)
            if m:
                v = float(m.group(1))
                best = v if best is None else min(best, v)
            elif (m := _STATUS.search(line)):
                v, bound = float(m.group(1)), float(m.group(2))
                best = None if v >= 1e49 else v
                if time.perf_counter() - last < self.every_s:
                    continue
                last = time.perf_counter()
            elif (m := _ROOT.search(line)):
                bound = float(m.group(2) or m.group(4))
            else:
                continue
            self.report(time.perf_counter() - self.t0, best, None if bound is None or bound >= 1e49 else bound)

    def result(self) -> MilpOutcome:
        """Wait until the program ends or the limit passes (then SIGINT: CBC stops its search and
        writes its best solution; `GRACE_S` later SIGKILL), read its solution, and fill the
        problem's variables with it (`monet.solver.milp.finish`).  A program killed, or ended
        without a solution file, is status "no_integer" with ``detail``."""
        child, detail = self.child, ""
        self.watchdog.join()
        child.wait()
        if self.killed:
            detail = f"PuLP's CBC did not answer within {self.deadline - self.t0 + GRACE_S:.0f} s and was stopped"
        self.reader.join(timeout=5.0)
        elapsed = time.perf_counter() - self.t0
        sol = os.path.join(self.workdir.name, "model.sol")
        if not detail and not os.path.exists(sol):
            detail = f"PuLP's CBC stopped without an answer (exit status {child.returncode})"
        x, optimal, infeasible = (None, False, False) if detail else read_solution(sol, self.form.n)
        self.workdir.cleanup()
        if detail:
            return self.report.lost(detail, elapsed)
        return finish(self.problem, self.form, x, optimal, infeasible, self.final_bound, self.gap_abs, elapsed,
                      self.report)


def _lines(log: io.BufferedReader):
    """The lines of the program's log until it closes (a terminal's end reads as EIO)."""
    try:
        yield from log
    except OSError:
        pass
    finally:
        log.close()


def _log_channel() -> tuple[int, int]:
    """(read end, write end) for the program's log: a pseudo-terminal, so that CBC's C library
    writes each line as it comes (into a pipe it buffers the whole log until it exits, and the
    incumbents' times would be its end); a pipe where there is none."""
    try:
        return os.openpty()
    except (AttributeError, OSError):
        return os.pipe()


def _command() -> list[str]:
    """The program a solve runs (`cbc_program`); tests put another in its place."""
    return [cbc_program()]


def start_pulp_cbc(problem: cp.Problem, *, time_limit: float, gap_abs: float = 0.0, start: dict | None = None,
                   progress=None, every_s: float = 5.0, verbose: bool = False, shown_offset: float = 0.0,
                   threads: int | None = None) -> PulpCbcRun:
    """Start solving a cvxpy MILP with PuLP's CBC program; read the answer with
    `PulpCbcRun.result`.  Arguments as `solve_pulp_cbc`'s."""
    command = _command()  # first: an absent pulp is refused before any work
    t0 = time.perf_counter()
    threads = default_threads() if threads is None else max(1, int(threads))
    form = standard_form(problem, start)
    workdir = tempfile.TemporaryDirectory(prefix="monet-pulp-")
    mps, mst, sol = (os.path.join(workdir.name, f"model.{e}") for e in ("mps", "mst", "sol"))
    write_mps(mps, form)
    write_s = time.perf_counter() - t0
    args = command + [mps, "-threads", str(threads), "-timeMode", "elapsed",
                      "-sec", f"{max(0.7 * (time_limit - write_s), 0.1):g}", "-allow", f"{max(gap_abs, 0.0):.12g}",
                      "-randomSeed", "1", "-randomCbcSeed", "1"]
    if write_start(mst, form):
        args += ["-mips", mst]
    args += ["-solve", "-solution", sol]
    report = Reporter(progress, form.offset, shown_offset)
    if progress is not None:
        progress(f"  PuLP's CBC: {form.n} columns, {form.m} rows written in {write_s:.1f} s, {threads} threads")
    read_end, write_end = _log_channel()
    try:
        child = subprocess.Popen(args, stdout=write_end, stderr=write_end, stdin=subprocess.DEVNULL)
    finally:
        os.close(write_end)
    return PulpCbcRun(problem, form, report, gap_abs, t0 + time_limit, t0, child, io.open(read_end, "rb"), workdir,
                      every_s, verbose, threads, write_s)


def solve_pulp_cbc(problem: cp.Problem, *, time_limit: float, gap_abs: float = 0.0, start: dict | None = None,
                   progress=None, every_s: float = 5.0, verbose: bool = False, shown_offset: float = 0.0,
                   threads: int | None = None) -> MilpOutcome:
    """Solve a cvxpy MILP (minimisation, linear constraints) with PuLP's CBC program on
    ``threads`` threads; the inputs and the outcome are `monet.solver.cbc.solve_cbc`'s.

    Args:
        time_limit: wall-clock seconds for the whole call, the MPS file's writing included; CBC's
            clock gets 70 % of what is left after it, the program is interrupted at the limit and
            killed `GRACE_S` later (status "no_integer", see ``detail``: the start stands).
        gap_abs: stop when incumbent - bound <= this (model units; CBC's ``-allow``).
        start: {cvxpy Variable: values} of a feasible schedule (``-mips``); variables left out are
            computed by CBC.
        progress: ``progress(str)``: the file's size and write time, then one line per new
            incumbent and every ``every_s`` seconds (from a reader thread).  CBC's log goes to
            standard error with ``verbose``.
        shown_offset: added to the objective and bound in progress lines (the constant time).
        threads: CBC's threads; None: the cores this process may run on (`default_threads`).

    Returns:
        `MilpOutcome`; when a solution exists, the problem's variables hold it.

    Raises:
        PulpUnavailable: pulp is not installed (or its CBC program cannot run).
        OSError: the temporary files cannot be written.
    """
    return start_pulp_cbc(problem, time_limit=time_limit, gap_abs=gap_abs, start=start, progress=progress,
                          every_s=every_s, verbose=verbose, shown_offset=shown_offset, threads=threads).result()
