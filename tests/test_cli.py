"""The command line, run in-process through ``monet.cli.main`` on a small user model file."""
import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from monet.cli import main
from monet.solution import load_solution

TINY_MODEL = textwrap.dedent("""\
    from torch import nn


    def build():
        layers = [nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()]
        for _ in range(4):
            layers += [nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()]
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)]
        return nn.Sequential(*layers)
    """)

SOLVE_KEYS = {"status", "objective", "bound", "gap", "solve_time_s", "budget_bytes", "predicted_peak_bytes",
              "eager_peak_bytes", "output"}
CHECK_KEYS = SOLVE_KEYS - {"output"} | {"peak_bytes", "eager_measured_peak_bytes", "grad_rel_error",
                                        "overhead"}


def last_json(text: str) -> dict:
    lines = text.strip().splitlines()
    assert lines, "nothing on stdout"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def model_arg(workdir):
    path = workdir / "tiny_net.py"
    path.write_text(TINY_MODEL)
    return f"{path}:build"


def solve_args(model_arg, *extra):
    # 10 s: the smallest-budget search on this small net ran to the default 60 s limit (51 s for
    # this module's two solves); a later --time-limit in ``extra`` wins
    return ["solve", model_arg, "--batch-size", "2", "--input-shape", "3,16,16", "--time-limit", "10", *extra]


def run_main(argv):
    """``main(argv)`` with stdout and stderr captured: (stdout, stderr, exit code)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return stdout.getvalue(), stderr.getvalue(), code


def workspace_args(workdir):
    """Measured workspace (so the measured peak can be held to the budget), cached in the module's
    folder: every solve of the module costs the graph with the same measurement."""
    return ["--cost", "workspace", "--cache-dir", str(workdir / "cache")]


@pytest.fixture(scope="module")
def least_solved(model_arg, workdir):
    """``monet solve ... --min-budget --json`` with measured workspace, run once for the module:
    (stdout, stderr, exit code, solution path)."""
    out = workdir / "min.pkl"
    return (*run_main(solve_args(model_arg, "--min-budget", *workspace_args(workdir), "--json", "-o", str(out))), out)


@pytest.fixture(scope="module")
def solved(model_arg, workdir, least_solved):
    """``monet solve ... --budget 80% --json`` with measured workspace, run once for the module:
    (stdout, stderr, exit code, solution path, budget in bytes).

    The workspace is measured on this machine, so whether 80 % of the plain peak is feasible
    depends on the machine: where it is below the smallest feasible budget this module's
    ``--min-budget`` run found, that budget is given instead (in bytes)."""
    stdout, stderr, code, _ = least_solved
    assert code == 0, stderr
    found = last_json(stdout)
    eighty = int(0.8 * found["eager_peak_bytes"])
    budget = max(eighty, found["budget_bytes"])
    out = workdir / "tiny.pkl"
    stdout, stderr, code = run_main(solve_args(model_arg, "--budget", "80%" if budget == eighty else str(budget),
                                               *workspace_args(workdir), "--json", "-o", str(out)))
    return stdout, stderr, code, out, budget


def test_help_lists_commands_with_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for word in ("solve", "check", "profile", "demo", "zoo", "examples:", "6GB", "50%"):
        assert word in text


@pytest.mark.parametrize("command", ["solve", "check", "profile", "demo"])
def test_command_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "examples" in capsys.readouterr().out or command == "demo"


def test_solve_json(solved, least_solved):
    stdout, stderr, code, out, budget = solved
    assert code == 0, stderr
    result = last_json(stdout)
    assert SOLVE_KEYS <= result.keys()
    assert result["output"] == str(out)
    saved = load_solution(out).meta  # the JSON reports the file it wrote
    assert (result["status"], result["budget_bytes"], result["predicted_peak_bytes"]) == \
        (saved.status, saved.budget_bytes, saved.predicted_peak_bytes)
    # at most the plain peak: below it where recomputation lowers this machine's peak (test_min_budget)
    assert result["predicted_peak_bytes"] <= result["budget_bytes"] == budget <= result["eager_peak_bytes"]
    assert result["eager_peak_bytes"] == last_json(least_solved[0])["eager_peak_bytes"]  # the same costs
    if result["status"] in ("optimal", "gap"):  # a proven schedule comes with its bound
        assert result["bound"] is not None and result["gap"] is not None
    if result["bound"] is not None:  # a heuristic schedule may beat the ILP's bound: then none is given
        assert result["bound"] <= result["objective"] + 1e-12
    for step in ("capturing", "costing", "solving"):
        assert step in stderr
    sol = load_solution(out)
    assert sol.meta.budget_bytes == result["budget_bytes"]
    assert sol.meta.batch_size == 2 and sol.meta.input_shape == (3, 16, 16)


def test_check_json(solved, capsys):
    _, _, _, out, _ = solved
    code = main(["check", str(out), "--check-diff", "--run-bs", "--json"])
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert code == 0, captured.err
    assert CHECK_KEYS <= result.keys()
    assert result["peak_bytes"] <= result["budget_bytes"]
    assert result["grad_rel_error"] <= 1e-5
    # bitwise on CPU when only recomputation is used. Other implementations may round differently
    # (conv algorithms) within 1e-5, checked above, or not at all (relu.store_input), so with them
    # bitwise equality is neither required nor ruled out.
    if not load_solution(out).schedule.impl:
        assert result["grads_bitwise_equal"] is True
    if result["budget_bytes"] < 0.95 * result["eager_peak_bytes"]:  # the prediction's 2 % and more below
        assert result["peak_bytes"] < result["eager_measured_peak_bytes"]
    assert result["overhead"] is None  # not asked for


def test_check_runtime(solved, capsys):
    _, _, _, out, _ = solved
    assert main(["check", str(out), "--check-runtime", "--repeats", "1", "--json"]) == 0
    result = last_json(capsys.readouterr().out)
    assert isinstance(result["overhead"], float) and result["overhead"] > -1
    assert result["peak_bytes"] is None


def test_infeasible_budget(model_arg, workdir, capsys):
    code = main(solve_args(model_arg, "--budget", "1KB", *workspace_args(workdir), "--json",
                           "-o", str(workdir / "never.pkl")))
    captured = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in captured.err
    # "the smallest feasible budget is N bytes", or "the smallest budget found feasible is N bytes"
    # when the solver did not prove it minimal within its time limit
    named = re.search(r"monet: error: .*smallest (?:feasible budget|budget found feasible) is (\d+) bytes",
                      captured.err)
    assert named, captured.err
    error = last_json(captured.out)
    assert error["min_budget_bytes"] == int(named.group(1)) > 1024
    assert named.group(1) in error["error"]
    assert not (workdir / "never.pkl").exists()


def test_min_budget(least_solved):
    """The smallest budget found, on the workspace measured here: at most the plain peak (below it
    wherever recomputation can lower this machine's peak: tests/test_end_to_end.py asserts that on
    recorded workspace, the same on every machine)."""
    stdout, stderr, code, out = least_solved
    assert code == 0, stderr
    assert "finding the smallest feasible budget" in stderr
    result = last_json(stdout)
    assert result["predicted_peak_bytes"] <= result["budget_bytes"] <= result["eager_peak_bytes"]
    assert load_solution(out).meta.budget_bytes == result["budget_bytes"]


@pytest.mark.parametrize("content", [b"", b"not a solution at all", b"MONET-SOLUTION\n\x01\x80\x04garbage"])
def test_corrupt_solution_is_a_clean_error(content, workdir, capsys):
    path = workdir / "corrupt.pkl"
    path.write_bytes(content)
    assert main(["check", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("monet: error: ") and str(path) in captured.err
    assert "Traceback" not in captured.err
    assert "error" in last_json(captured.out)


def test_missing_solution(workdir, capsys):
    assert main(["check", str(workdir / "absent.pkl")]) == 2
    assert "no such solution file" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--budget", "6 parsecs"], "cannot read budget"),
    (["--budget", "1GB", "--mode", "inplace_fast"], "unknown mode 'inplace_fast'"),
    (["--budget", "1GB", "--gpu-spec", "k80"], "unknown device preset"),
    (["--budget", "1GB", "--offload-bandwidth", "pcie5"], "--mode normal only"),
    (["--budget", "1GB", "--mode", "normal", "--offload-bandwidth", "pcie5"], "needs --device cuda"),
    (["--budget", "1GB", "--mode", "normal", "--device", "cuda", "--cost", "analytic",
      "--offload-bandwidth", "fast"], "must be bytes per second"),
])
def test_bad_arguments(model_arg, workdir, capsys, args, message):
    assert main(solve_args(model_arg, *args, "-o", str(workdir / "x.pkl"))) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("monet: error: ") and message in err


def test_offload_presets_are_the_solvers():
    """--help names the presets without importing the solver: the two lists stay one."""
    from monet.cli.solve import OFFLOAD_PRESETS
    from monet.solver.offload import DEFAULT_BANDWIDTHS

    assert OFFLOAD_PRESETS == tuple(DEFAULT_BANDWIDTHS)


def test_offload_solution(workdir):
    """--offload-bandwidth for a CUDA device, solved on this machine with analytic costs: the
    solution records the bandwidth it was planned for and fits its budget."""
    out, chain = workdir / "offload.pkl", workdir / "chain.py"
    # activations (batch 2048) far above the parameters: tests/test_offload.py's chain
    chain.write_text("from torch import nn\n\n\ndef build():\n"
                     "    return nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(64, 64), nn.Tanh())])\n")
    argv = ["solve", f"{chain}:build", "--batch-size", "2048", "--input-shape", "64", "--min-budget", "--mode", "normal",
            "--device", "cuda", "--cost", "analytic", "--gpu-spec", "h100", "--offload-bandwidth", "400e9",
            "--time-limit", "20", "--json", "-o", str(out)]
    stdout, stderr, code = run_main(argv)
    assert code == 0, stderr
    sol = load_solution(out)
    assert sol.meta.predicted_peak_bytes <= sol.meta.budget_bytes
    assert sol.meta.offload_bandwidth == 400e9
    assert sol.schedule.offload, "at the smallest budget, with copies hidden by compute, some value is offloaded"


def test_unknown_model(workdir, capsys):
    assert main(["solve", "resnet5O", "-b", "2", "--budget", "1GB", "-o", str(workdir / "x.pkl")]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_mismatched_model(solved, workdir, capsys):
    """check --model with another model: the solution does not fit, said in one line."""
    _, _, _, out, _ = solved
    other = workdir / "other_net.py"
    other.write_text(TINY_MODEL.replace("range(4)", "range(3)"))
    assert main(["check", str(out), "--model", f"{other}:build", "--check-diff"]) == 2
    err = capsys.readouterr().err
    assert "monet: error:" in err and "another graph" in err and "Traceback" not in err


def test_profile_writes_table(model_arg, workdir, capsys):
    """The table goes into the cache `monet solve --cost profile` reads, and with -o a copy to the
    file (-o alone wrote a file solve could not read)."""
    out = workdir / "tiny.csv"
    cache = workdir / "profile-cache"
    assert main(["profile", model_arg, "-b", "2", "--input-shape", "3,16,16", "--repeats", "1",
                 "--warmup", "0", "--top", "3", "--cache-dir", str(cache), "-o", str(out)]) == 0
    from monet.profiling.profiler import load_costs
    table = load_costs(out)
    assert len(table) > 0 and (table["workspace_bytes"] >= 0).all()
    assert "slowest 3 of" in capsys.readouterr().out
    cached = list(cache.glob("*.csv"))
    assert len(cached) == 1 and load_costs(cached[0]).equals(table)


def test_zoo_list_runs(capsys):
    """The shipped zoo lists its entries, or says it is empty (tests/test_zoo.py covers the rest)."""
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert "the zoo is empty" in out or ("predicted overhead" in out and "monet zoo get" in out)


def test_console_script_exit_status(model_arg, workdir):
    """The installed entry point: errors exit non-zero with one line and no traceback."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from monet.cli import main; sys.exit(main())",
                           "check", str(workdir / "absent.pkl")], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("monet: error:") and "Traceback" not in proc.stderr


def test_demo_on_a_small_model(model_arg, workdir, capsys):
    """The demo's whole pipeline (solve at two budgets, measure every method, plot) on the tiny model."""
    plot = workdir / "frontier.png"
    assert main(["demo", "--model", model_arg, "--batch-size", "2", "--input-shape", "3,16,16",
                 "--budgets", "50%,40%", "--time-limit", "10", "--repeats", "1", "--steps", "2",
                 "--device", "cpu", "--plot", str(plot), "--cache-dir", str(workdir / "cache"),
                 "--csv", str(workdir / "demo.csv")]) == 0
    captured = capsys.readouterr()
    raw = pd.read_csv(workdir / "demo.csv", dtype=str, keep_default_na=False)  # the table's rows, with provenance
    assert list(raw.method) == ["plain PyTorch", "Chen sqrt(n)", "torch.compile 0.5", "monet 50%", "monet 40%"]
    assert set(raw.command) == {"monet demo " + shlex.join(
        ["--model", model_arg, "--batch-size", "2", "--input-shape", "3,16,16", "--budgets", "50%,40%", "--time-limit",
         "10", "--repeats", "1", "--steps", "2", "--device", "cpu", "--plot", str(plot), "--cache-dir",
         str(workdir / "cache"), "--csv", str(workdir / "demo.csv")])}
    rows = {}
    for line in captured.out.splitlines():
        for method in ("plain PyTorch", "Chen sqrt(n)", "torch.compile 0.5", "monet 50%", "monet 40%"):
            if line.strip().startswith(method):
                rows[method] = line.strip()[len(method):].split()
    assert set(rows) == {"plain PyTorch", "Chen sqrt(n)", "torch.compile 0.5", "monet 50%", "monet 40%"}
    assert rows["plain PyTorch"][3:5] == ["100", "%"] and rows["plain PyTorch"][-1] == "reference"
    for method in ("monet 50%", "monet 40%"):
        budget, predicted, peak = (float(v) for v in rows[method][:3])
        assert peak <= budget and predicted <= budget, rows[method]
        assert rows[method][-1] == "bitwise"  # normal mode: recomputation changes no bit on the CPU
        assert rows[method][5][0] in "+-" and rows[method][6] == "%", rows[method]  # predicted overhead
    assert rows["Chen sqrt(n)"][5] == "-"  # no prediction for a method monet did not solve
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "above its budget" not in captured.out
    assert "demo finished" in captured.err


@pytest.mark.parametrize("argv, message", [(["--budgets", "50%,abc"], "cannot read budget 'abc'"),
                                           (["--budgets", ","], "names no budget"),
                                           (["--plot", "no_such_folder/f.png"], "does not exist")])
def test_demo_refuses_bad_options_before_any_slow_step(argv, message, capsys):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "building the model" not in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the zoo's schedules are checked there")
def test_check_of_a_gpu_schedule_asks_for_the_cpu_explicitly(capsys):
    """`monet check zoo:resnet50-184-6GB --run-bs` without a GPU would train ResNet-50 at batch 184
    (a 15 GiB plain peak) on the CPU: it says so and asks for --device cpu."""
    assert main(["check", "zoo:resnet50-184-6GB", "--run-bs"]) == 2
    err = capsys.readouterr().err
    assert "--device cpu" in err and "batch 184" in err and "GiB" in err and "Traceback" not in err


def _documented_commands():
    """Every ``monet COMMAND ...`` line of a shell block in README.md and docs/*.md."""
    from doc_blocks import FILES, fenced_blocks

    return [(path.name, line.split("#", 1)[0].strip()) for path in FILES for b in fenced_blocks(path)
            if b.info != "python" for line in b.code.splitlines() if line.strip().startswith("monet ")]


def test_every_documented_command_names_options_its_parser_has():
    """each ``monet`` command the docs show names a command and options that exist
    (checked against the parser, so a renamed flag fails here, not in a reader's shell)."""
    import shlex

    from monet.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    lines = _documented_commands()
    assert len(lines) >= 15
    for where, line in lines:
        if line.split()[1] not in subs and not line.split()[1].startswith("-"):
            continue  # not a command: an error message, a table row of monet demo's output
        try:
            tokens = shlex.split(line.replace("\\", " "))[1:]  # a line continued with a backslash
        except ValueError as e:
            raise AssertionError(f"{where}: {line!r} is not a shell command: {e}") from None
        if not tokens or tokens[0].startswith("-") or not re.fullmatch(r"[a-z]+", tokens[0]):
            continue  # `monet --help`, or a table row of monet demo's output ("monet 50% ...")
        assert tokens[0] in subs, (where, line)
        p, rest = subs[tokens[0]], tokens[1:]
        nested = [a for a in p._actions if a.choices and isinstance(a.choices, dict)]  # monet zoo list / get ...
        if nested and rest and rest[0] in nested[0].choices:
            p, rest = nested[0].choices[rest[0]], rest[1:]
        known = {s for a in p._actions for s in a.option_strings}
        for tok in rest:
            if tok.startswith("-") and not re.fullmatch(r"-?\d[\d.e]*", tok):
                assert tok.split("=", 1)[0] in known, (where, line, tok)


def test_solve_and_check_compiled(model_arg, workdir, capsys):
    """``monet solve --compile --min-budget`` writes a solution for the compiled step at its smallest
    budget, measured on this machine; ``monet check`` runs it compiled against ``torch.compile``: its peak at or under the
    budget, gradients within 1e-5; the same check with ``--trace`` (node by node, eager) is
    refused."""
    out = workdir / "compiled.pkl"
    stdout, stderr, code = run_main(solve_args(model_arg, "--min-budget", "--compile", "--cost", "analytic",
                                               "--json", "-o", str(out)))
    assert code == 0, stderr
    meta = load_solution(out).meta
    assert meta.compiled and meta.measured_peak_bytes is not None, "the compiled step was not measured"
    assert meta.measured_peak_bytes <= meta.budget_bytes and "measuring the compiled step" in stderr
    code = main(["check", str(out), "--check-diff", "--run-bs", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = last_json(captured.out)
    assert result["peak_bytes"] <= result["budget_bytes"]
    assert result["grad_rel_error"] <= 1e-5
    assert main(["check", str(out), "--trace"]) == 2
    assert "compiled solution" in capsys.readouterr().err
