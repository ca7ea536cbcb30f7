"""Model inputs on the command line: ``--inputs`` specs, factories that return (model, example_inputs),
solutions that remember how their inputs were made, and a tiny transformers GPT-2 end to end."""
import contextlib
import io
import json
import textwrap

import numpy as np
import pytest
from ci import skip_unless_long
import torch

from monet.cli import main
from monet.models import build as _build
from monet.inputs import SPEC_FORMAT, InputEntry, inputs_from_spec, parse_inputs_spec
from monet.solution import Schedule, Solution, SolutionMeta, load_solution, save_solution
from monet.zoo.models import example_input, get_model_and_inputs
from reach_models import declare_torchvision_ops, missing

GPT2_FILE = textwrap.dedent("""\
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel


    def _model():
        config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                            bos_token_id=0, eos_token_id=0, use_cache=False)
        return GPT2LMHeadModel(config)


    def build():
        ids = torch.randint(0, 128, (2, 16))
        return _model(), {"input_ids": ids, "labels": ids.clone()}


    def module_only():
        return _model()
    """)

TINY_CNN = textwrap.dedent("""\
    import torch
    from torch import nn


    def build():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5))


    def with_inputs():
        return build(), torch.randn(3, 3, 8, 8)
    """)


def run(argv):
    """``monet ARGV`` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------
# the spec
# ----------------------------------------------------------------------------------------------


def test_parse_keyword_and_positional_entries():
    entries = parse_inputs_spec("3x64x64:float32, mask=64:bool,input_ids=16:int64:50257,t=:int32, n=8")
    assert entries == (
        InputEntry(None, (3, 64, 64), torch.float32, None),
        InputEntry("mask", (64,), torch.bool, None),
        InputEntry("input_ids", (16,), torch.int64, 50257),
        InputEntry("t", (), torch.int32, 2),  # integers default to [0, 2)
        InputEntry("n", (8,), torch.float32, None),
    )


def test_inputs_from_spec_values_and_determinism():
    spec = "3x4:bfloat16,ids=5:int64:7,m=5:bool,y=:uint8:3"
    a, b = inputs_from_spec(spec, 4), inputs_from_spec(spec, 4)
    assert a.args[0].shape == (4, 3, 4) and a.args[0].dtype == torch.bfloat16
    assert a.kwargs["ids"].shape == (4, 5) and a.kwargs["ids"].dtype == torch.int64
    assert 0 <= int(a.kwargs["ids"].min()) and int(a.kwargs["ids"].max()) < 7
    assert a.kwargs["m"].dtype == torch.bool and a.kwargs["y"].shape == (4,)
    assert int(a.kwargs["y"].max()) < 3
    assert all(torch.equal(x, y) for x, y in zip(a.leaves(), b.leaves()))
    assert not torch.equal(inputs_from_spec(spec, 4, seed=1).kwargs["ids"], a.kwargs["ids"])
    # one float32 positional entry is --input-shape's tensor
    assert torch.equal(inputs_from_spec("3x16x16", 2).first, example_input("x.py:f", 2, (3, 16, 16)))


@pytest.mark.parametrize("spec, entry, why", [
    ("", None, "empty input spec"),
    ("3x4,,ids=5:int64", "", "empty entry"),
    ("3x0", "3x0", "must be positive sizes joined by 'x'"),
    ("3,4", "4", None),  # a comma starts a new entry: '4' is then a second positional entry, fine
    ("ids=16:int65", "ids=16:int65", "unknown dtype 'int65'"),
    ("x=3:float32:5", "x=3:float32:5", "HIGH applies to integer dtypes only"),
    ("m=3:bool:2", "m=3:bool:2", "HIGH applies to integer dtypes only"),
    ("ids=3:int64:0", "ids=3:int64:0", "must be a positive integer"),
    ("ids=3:uint8:300", "ids=3:uint8:300", "exceeds the range of uint8"),
    ("ids=3:int64:5:9", "ids=3:int64:5:9", "too many ':' fields"),
    ("1d=3", "1d=3", "is not an argument name"),
    ("a=3,3x4", "3x4", "positional entry (no NAME=) after a keyword entry"),
    ("a=3,a=4", "a=4", "the name 'a' is given twice"),
])
def test_bad_specs_name_the_entry_and_the_format(spec, entry, why):
    if why is None:
        assert len(parse_inputs_spec(spec)) == 2
        return
    with pytest.raises(ValueError) as e:
        parse_inputs_spec(spec)
    message = str(e.value)
    assert why in message and SPEC_FORMAT in message
    if entry is not None:
        assert f"bad input spec entry {entry!r}" in message


def test_cli_bad_spec_is_a_clean_error(tmp_path):
    code, out, err = run(["solve", "resnet50", "-b", "2", "--inputs", "ids=16:int64:x", "--budget", "1GB",
                          "--json", "-o", str(tmp_path / "s.pkl")])
    assert code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("monet: error: --inputs: bad input spec entry 'ids=16:int64:x'")
    assert "[NAME=]SHAPE[:DTYPE[:HIGH]]" in line and "error" in last_json(out)


def test_input_shape_and_inputs_are_exclusive(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["solve", "resnet50", "-b", "2", "--inputs", "3x8x8", "--input-shape", "3,8,8", "--budget",
              "1GB", "-o", str(tmp_path / "s.pkl")])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# models and their inputs
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def cnn_file(tmp_path):
    path = tmp_path / "cnn.py"
    path.write_text(TINY_CNN)
    return path


def test_build_every_form(cnn_file):
    model, inputs = _build(f"{cnn_file}:build", 2, (3, 8, 8))
    _, same = _build(f"{cnn_file}:build", 2, inputs_spec="3x8x8")
    assert torch.equal(inputs.first, same.first) and inputs.first.shape == (2, 3, 8, 8)
    model, own = _build(f"{cnn_file}:with_inputs", None)
    assert own.batch_size == 3 and own.first.shape == (3, 3, 8, 8)
    assert _build(f"{cnn_file}:with_inputs", 3, (3, 8, 8))[1].batch_size == 3  # consistent options are fine
    _, tokens = _build("gpt2-small", 2, (8,))
    assert tokens.first.dtype == torch.int64 and tokens.first.shape == (2, 8)


@pytest.mark.parametrize("batch, shape, spec, message", [
    (4, None, None, "returns example inputs of batch 3"),
    (None, (3, 9, 9), None, "not (3, 9, 9)"),
    (None, None, "3x8x8", "do not give an input spec"),
])
def test_factory_inputs_conflicts(cnn_file, batch, shape, spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_model_and_inputs(f"{cnn_file}:with_inputs", batch, shape, spec)


def test_cli_factory_batch_mismatch(cnn_file, tmp_path):
    code, _, err = run(["solve", f"{cnn_file}:with_inputs", "-b", "4", "--min-budget",
                        "-o", str(tmp_path / "s.pkl")])
    assert code == 2
    assert "returns example inputs of batch 3" in err and "leave the batch size (--batch-size) out" in err


@pytest.mark.parametrize("argv, message", [
    (["-b", "2"], "is not a zoo model and returns no example inputs"),
    ([], "needs a batch size"),
])
def test_cli_module_factory_needs_batch_and_inputs(cnn_file, tmp_path, argv, message):
    code, _, err = run(["solve", f"{cnn_file}:build", *argv, "--min-budget", "-o", str(tmp_path / "s.pkl")])
    assert code == 2 and message in err and "Traceback" not in err


def test_factory_returning_something_else(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def build():\n    return 3, 4\n")
    with pytest.raises(TypeError, match="not a torch.nn.Module or a pair"):
        get_model_and_inputs(f"{path}:build", 2, (3,))


# ----------------------------------------------------------------------------------------------
# solution files
# ----------------------------------------------------------------------------------------------


def _meta(**kw):
    fields = dict(model="m.py:build", batch_size=2, input_shape=(16,), dtype="int64", budget_bytes=1, mode="normal",
                  device="cpu", cost_source="analytic", predicted_peak_bytes=1, eager_peak_bytes=1, objective_s=1.0,
                  bound_s=None, gap=None, solve_time_s=0.0, status="heuristic", solver="CBC", torch_version="x",
                  monet_version="x", fingerprint="f", graph_summary=[], n_fwd=0, n_bwd=0)
    return SolutionMeta(**{**fields, **kw})


def test_old_solution_without_inputs_spec_loads(tmp_path):
    sol = Solution(Schedule(saved=(), stages=[]), np.zeros((0, 0), bool), np.zeros((0, 0), bool), _meta())
    del sol.meta.__dict__["inputs_spec"]  # as pickled by a monet without the field
    save_solution(sol, tmp_path / "old.pkl")
    assert b"inputs_spec" not in (tmp_path / "old.pkl").read_bytes()
    assert load_solution(tmp_path / "old.pkl").meta.inputs_spec is None
    sol.meta.inputs_spec = "input_ids=16:int64:128"
    save_solution(sol, tmp_path / "new.pkl")
    assert load_solution(tmp_path / "new.pkl").meta.inputs_spec == "input_ids=16:int64:128"


# ----------------------------------------------------------------------------------------------
# a transformers GPT-2 end to end
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_file(tmp_path_factory):
    reason = missing("transformers")  # declares torchvision's ops first (its C extension does not load here)
    if reason:
        pytest.skip(reason)
    declare_torchvision_ops()
    path = tmp_path_factory.mktemp("gpt2") / "model.py"
    path.write_text(GPT2_FILE)
    return path


SOLVE = ["--min-budget", "--mode", "normal", "--cost", "analytic", "--time-limit", "5", "--json"]


def _solve_and_check(argv, out):
    code, stdout, err = run(["solve", *argv, *SOLVE, "-o", str(out)])
    assert code == 0, err[-4000:]
    solved = last_json(stdout)
    assert solved["predicted_peak_bytes"] <= solved["budget_bytes"] < solved["eager_peak_bytes"], solved
    code, stdout, err = run(["check", str(out), "--check-diff", "--json"])
    assert code == 0, err[-4000:]
    checked = last_json(stdout)
    # mode normal only recomputes: bitwise PyTorch's gradients (dropout replays its random state)
    assert checked["grads_bitwise_equal"] is True and checked["grad_rel_error"] == 0.0, checked
    assert checked["buffers_bitwise_equal"] is True, checked
    return solved, load_solution(out).meta


def test_gpt2_factory_with_inputs(gpt2_file, tmp_path):
    """build() returns (model, {"input_ids", "labels"}): no --batch-size, no --input-shape."""
    skip_unless_long("a factory that returns its inputs", 28, "the short suite solves and checks the GPT-2 through --inputs "
               "(the same solve and check, the inputs from a spec)")
    solved, meta = _solve_and_check([f"{gpt2_file}:build"], tmp_path / "s.pkl")
    assert (solved["batch_size"], solved["input_shape"], solved["dtype"]) == (2, [16], "int64")
    assert meta.inputs_spec is None and solved["inputs"] is None


def test_gpt2_module_factory_with_inputs_spec(gpt2_file, tmp_path):
    """module_only() returns the module; --inputs gives its keyword inputs, and check rebuilds them
    from the spec the solution recorded."""
    spec = "input_ids=16:int64:128,labels=16:int64:128"
    solved, meta = _solve_and_check([f"{gpt2_file}:module_only", "-b", "2", "--inputs", spec], tmp_path / "s.pkl")
    assert solved["inputs"] == spec
    assert meta.inputs_spec == spec and (meta.batch_size, meta.input_shape, meta.dtype) == (2, (16,), "int64")
