"""The solution file: round trip, refusal of foreign or broken files, and graph-compatibility checks."""
import io
import os
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import monet
from monet import solution as sf
from monet.capture import capture
from monet.solution import (FORMAT_VERSION, MAGIC, Schedule, Solution, SolutionFileError, SolutionMeta,
                            SolutionMismatchError, Stage, check_compatible, describe, load_solution,
                            save_solution)

HEADER = MAGIC + bytes([FORMAT_VERSION])


def mlp(act):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), act, nn.Linear(8, 2))


@pytest.fixture(scope="module")
def graph():
    return capture(mlp(nn.ReLU()), torch.randn(3, 4))


@pytest.fixture(scope="module")
def other_graph():
    """Same shapes, one op different (tanh for relu)."""
    return capture(mlp(nn.Tanh()), torch.randn(3, 4))


def make_solution(graph, **meta_overrides) -> Solution:
    n, t = len(graph.fwd), len(graph.bwd)
    S = np.zeros((t, n), np.uint8)
    S[:, 0] = 1
    R = np.zeros((t, n), bool)
    R[1, 1] = R[2, 1] = True
    stages = [Stage(backward=k, recompute=(1,) if R[k, 1] else (), release=(0,) if k == t - 1 else ())
              for k in range(t)]
    meta = dict(model="mlp", batch_size=np.int64(3), input_shape=(4,), dtype=torch.float32,
                budget_bytes=6 * 2**30, mode="inplace_conv_multiway_newnode", device="cpu",
                cost_source="analytic", predicted_peak_bytes=np.int64(5 * 2**30), eager_peak_bytes=8 * 2**30,
                objective_s=np.float64(1.05), bound_s=1.0, gap=0.05 / 1.05, solve_time_s=12.5,
                status="time_limit", solver="CBC", torch_version=torch.__version__,
                monet_version=monet.__version__, fingerprint=graph.fingerprint,
                graph_summary=list(graph.summary), n_fwd=n, n_bwd=t, eager_time_s=1.0)
    meta.update(meta_overrides)
    return Solution(schedule=Schedule(saved=(0,), stages=stages, impl={0: "addmm"}), S=S, R=R,
                    meta=SolutionMeta(**meta))


@pytest.fixture
def saved(graph, tmp_path):
    path = tmp_path / "solution.pkl"
    sol = make_solution(graph)
    save_solution(sol, path)
    return sol, path


# --- round trip ---------------------------------------------------------------------------------

def test_round_trip(saved):
    sol, path = saved
    data = path.read_bytes()
    assert data.startswith(HEADER)
    back = load_solution(path)
    assert back == sol
    assert back.meta == sol.meta and back.schedule == sol.schedule
    assert back.S.dtype == np.uint8 and back.R.dtype == bool
    np.testing.assert_array_equal(back.S, sol.S)
    np.testing.assert_array_equal(back.R, sol.R)
    assert back.meta.graph_summary == sol.meta.graph_summary
    # numpy scalars and torch dtypes given to the constructor are stored as plain Python values
    assert type(back.meta.batch_size) is int and back.meta.dtype == "float32"
    assert type(back.meta.objective_s) is float


def test_solution_equality_sees_arrays(graph):
    a, b = make_solution(graph), make_solution(graph)
    assert a == b
    b.R[0, 0] = True
    assert a != b


def test_payload_uses_only_the_allow_list(saved):
    """The allow-list holds what a real solution needs, and a real solution needs no builtins."""
    _, path = saved
    seen = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add(f"{module}.{name}")
            return super().find_class(module, name)

    Recording(io.BytesIO(path.read_bytes()[len(HEADER):])).load()
    assert seen == {"monet.solution.Solution", "monet.solution.SolutionMeta", "monet.solution.Schedule",
                    "monet.solution.Stage", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
                    "numpy.dtype"}
    # the restricted unpickler admits each of them (it refuses any global outside its allow-list)
    assert sf.load_solution(path).meta.fingerprint == saved[0].meta.fingerprint


def test_numpy_scalar_in_payload_is_admitted(graph, tmp_path):
    """A numpy scalar that reaches the pickle (numpy._core.multiarray.scalar) still loads."""
    sol = make_solution(graph)
    sol.schedule.impl[1] = "relu"
    sol.meta.gap = np.float64(0.25)  # bypasses __post_init__'s coercion, as an old writer might
    path = tmp_path / "s.pkl"
    save_solution(sol, path)
    assert b"scalar" in path.read_bytes()
    assert load_solution(path).meta.gap == 0.25


def test_recompute_count(graph):
    assert make_solution(graph).schedule.recompute_count() == 2
    assert Schedule(saved=(), stages=[Stage(0, (1, 2, 1), ()), Stage(1)]).recompute_count() == 3


def test_save_is_atomic(saved, monkeypatch):
    sol, path = saved
    before = path.read_bytes()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(sf.pickle, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        save_solution(sol, path)
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == [path.name]  # no temporary file left behind


def test_save_overwrites(saved, graph):
    _, path = saved
    sol2 = make_solution(graph, budget_bytes=2**30)
    save_solution(sol2, path)
    assert load_solution(path).meta.budget_bytes == 2**30
    assert os.listdir(path.parent) == [path.name]


def test_status_is_checked(graph):
    with pytest.raises(ValueError, match="status"):
        make_solution(graph, status="done")


# --- files that are refused ---------------------------------------------------------------------

def test_missing_file(tmp_path):
    path = tmp_path / "nope.pkl"
    with pytest.raises(SolutionFileError, match="no such") as e:
        load_solution(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("cut", ["half", "minus_one", "header", "magic_only", "partial_magic"])
def test_truncated_file(saved, tmp_path, cut):
    _, path = saved
    data = path.read_bytes()
    n = {"half": len(data) // 2, "minus_one": len(data) - 1, "header": len(HEADER),
         "magic_only": len(MAGIC), "partial_magic": 5}[cut]
    bad = tmp_path / "truncated.pkl"
    bad.write_bytes(data[:n])
    with pytest.raises(SolutionFileError, match="truncated or corrupt: re-run monet solve") as e:
        load_solution(bad)
    assert str(bad) in str(e.value)


def test_random_bytes(tmp_path):
    bad = tmp_path / "random.bin"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(SolutionFileError, match="not a monet solution file") as e:
        load_solution(bad)
    assert str(bad) in str(e.value)


def test_plain_pickle_is_not_a_solution_file(graph, tmp_path):
    bad = tmp_path / "plain.pkl"
    bad.write_bytes(pickle.dumps(make_solution(graph), protocol=4))
    with pytest.raises(SolutionFileError, match="not a monet solution file"):
        load_solution(bad)


def test_empty_file(tmp_path):
    bad = tmp_path / "empty.pkl"
    bad.write_bytes(b"")
    with pytest.raises(SolutionFileError, match="not a monet solution file"):
        load_solution(bad)


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1, 255])
def test_wrong_version(saved, tmp_path, version):
    _, path = saved
    data = bytearray(path.read_bytes())
    data[len(MAGIC)] = version
    bad = tmp_path / "version.pkl"
    bad.write_bytes(bytes(data))
    with pytest.raises(SolutionFileError, match=f"unsupported solution format version {version}") as e:
        load_solution(bad)
    assert str(bad) in str(e.value)


def test_corrupt_payload(saved, tmp_path):
    _, path = saved
    data = bytearray(path.read_bytes())
    data[len(HEADER) + 2: len(HEADER) + 40] = b"\xff" * 38
    bad = tmp_path / "corrupt.pkl"
    bad.write_bytes(bytes(data))
    with pytest.raises(SolutionFileError, match="truncated or corrupt"):
        load_solution(bad)


def test_payload_that_is_not_a_solution(tmp_path):
    bad = tmp_path / "dict.pkl"
    bad.write_bytes(HEADER + pickle.dumps({"S": [1, 2]}, protocol=4))
    with pytest.raises(SolutionFileError, match="does not hold a monet Solution"):
        load_solution(bad)


def test_inconsistent_arrays_are_refused(graph, tmp_path):
    sol = make_solution(graph)
    sol.R = sol.R[:, :2]
    with pytest.raises(SolutionFileError, match="S has shape"):
        save_solution(sol, tmp_path / "s.pkl")
    bad = tmp_path / "inconsistent.pkl"
    bad.write_bytes(HEADER + pickle.dumps(sol, protocol=4))
    with pytest.raises(SolutionFileError, match="S has shape"):
        load_solution(bad)


class _Shell:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return os.system, (self.cmd,)


class _Exec:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return exec, (self.code,)


def _assert_refused(path, forbidden):
    with pytest.raises(SolutionFileError) as e:
        load_solution(path)
    msg = str(e.value)
    assert f"refusing to load: the file references {forbidden}, which is not a monet type" in msg
    assert str(path) in msg


def test_os_system_payload_is_not_executed(tmp_path):
    pwned = tmp_path / "pwned"
    payload = pickle.dumps(_Shell(f"touch {pwned}"), protocol=4)
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(HEADER + payload)
    _assert_refused(bad, f"{os.system.__module__}.system")  # posix.system on Linux
    assert not pwned.exists()
    pickle.loads(payload)  # the payload is live: plain pickle runs it
    assert pwned.exists()


def test_exec_payload_is_not_executed(tmp_path):
    pwned = tmp_path / "pwned"
    payload = pickle.dumps(_Exec(f"open({str(pwned)!r}, 'w').close()"), protocol=4)
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(HEADER + payload)
    _assert_refused(bad, "builtins.exec")
    assert not pwned.exists()
    pickle.loads(payload)
    assert pwned.exists()


def test_eval_payload_protocol0_is_not_executed(tmp_path):
    """Hand-written protocol-0 pickle (GLOBAL opcode, not STACK_GLOBAL) calling builtins.eval."""
    pwned = tmp_path / "pwned"
    code = f"open({str(pwned)!r}, 'w').close()"
    payload = b"cbuiltins\neval\n(V" + code.encode() + b"\ntR."
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(HEADER + payload)
    _assert_refused(bad, "builtins.eval")
    assert not pwned.exists()
    pickle.loads(payload)
    assert pwned.exists()


def test_forbidden_global_nested_in_a_real_solution(graph, tmp_path):
    """A malicious object deep inside an otherwise valid solution is refused too."""
    pwned = tmp_path / "pwned"
    sol = make_solution(graph)
    sol.schedule.impl[0] = _Shell(f"touch {pwned}")  # bypasses __post_init__
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(HEADER + pickle.dumps(sol, protocol=4))
    _assert_refused(bad, f"{os.system.__module__}.system")
    assert not pwned.exists()


def test_other_module_class_is_refused(tmp_path):
    bad = tmp_path / "odict.pkl"
    bad.write_bytes(HEADER + pickle.dumps(__import__("collections").OrderedDict(a=1), protocol=4))
    _assert_refused(bad, "collections.OrderedDict")


# --- compatibility ------------------------------------------------------------------------------

def compat(sol, graph, **kw):
    args = dict(model="mlp", batch_size=3, input_shape=(4,), dtype="float32")
    args.update(kw)
    check_compatible(sol.meta, graph.fingerprint, graph.summary, **args)


def test_compatible(graph):
    sol = make_solution(graph)
    compat(sol, graph)
    compat(sol, graph, model=None, dtype=torch.float32)


def test_batch_size_mismatch(graph):
    sol = make_solution(graph, batch_size=184)
    with pytest.raises(SolutionMismatchError, match=r"batch size differs \(made for 184, called with 32\)"):
        compat(sol, graph, batch_size=32)


def test_input_shape_mismatch(graph):
    sol = make_solution(graph, input_shape=(3, 224, 224))
    with pytest.raises(SolutionMismatchError) as e:
        compat(sol, graph, input_shape=(3, 128, 128))
    assert "input shape differs (made for (3, 224, 224), called with (3, 128, 128))" in str(e.value)


def test_input_shape_with_batch_dimension_hint(graph):
    sol = make_solution(graph)
    with pytest.raises(SolutionMismatchError, match="excludes the batch dimension"):
        compat(sol, graph, input_shape=(3, 4))


def test_dtype_mismatch(graph):
    sol = make_solution(graph)
    with pytest.raises(SolutionMismatchError, match=r"dtype differs \(made for float32, called with float16\)"):
        compat(sol, graph, dtype=torch.float16)


def test_model_mismatch_and_several_differences(graph):
    sol = make_solution(graph, model="resnet50", batch_size=184)
    with pytest.raises(SolutionMismatchError) as e:
        compat(sol, graph, model="vgg16", batch_size=32)
    msg = str(e.value)
    assert "model differs (made for resnet50, called with vgg16)" in msg
    assert "made for 184, called with 32" in msg


def test_graph_mismatch_names_the_node(graph, other_graph):
    sol = make_solution(graph)
    i = next(k for k, (a, b) in enumerate(zip(graph.summary, other_graph.summary)) if a != b)
    with pytest.raises(SolutionMismatchError) as e:
        compat(sol, other_graph)
    msg = str(e.value)
    assert f"first difference at node {i}:" in msg
    assert f"solution has `{graph.summary[i]}`" in msg and "aten.relu" in graph.summary[i]
    assert f"this model has `{other_graph.summary[i]}`" in msg and "aten.tanh" in other_graph.summary[i]
    assert f"has {len(graph.summary)} nodes ({len(graph.fwd)} forward, {len(graph.bwd)} backward" in msg


def test_graph_mismatch_extra_node():
    lines = [f"call_function aten.op{k}.default (%{k};) -> (3,):float32" for k in range(5)]
    meta = make_solution_meta(lines[:4])
    with pytest.raises(SolutionMismatchError) as e:
        check_compatible(meta, "other", lines, model=None, batch_size=3, input_shape=(4,), dtype="float32")
    msg = str(e.value)
    assert "first difference at node 4: solution has `(no such node)`, this model has `" + lines[4] in msg
    assert "has 4 nodes" in msg and "this model's has 5" in msg


def test_fingerprint_mismatch_with_equal_summaries():
    meta = make_solution_meta(["a", "b"])
    with pytest.raises(SolutionMismatchError, match="summaries agree but the fingerprints do not"):
        check_compatible(meta, "f" * 64, ["a", "b"], model=None, batch_size=3, input_shape=(4,), dtype="float32")


def test_same_graph_split_into_other_nodes_is_refused(graph):
    """A solution from a monet that grouped the same joint graph's ops into other nodes (before
    ``_unsafe_view`` was folded as a view, GPT-2's had 37 more forward nodes) names other ops by
    its node ids: refused, with both counts."""
    sol = make_solution(graph)
    nodes = (len(graph.fwd), len(graph.bwd))
    compat(sol, graph, nodes=nodes)
    with pytest.raises(SolutionMismatchError, match=rf"{nodes[0] + 1} forward and {nodes[1]} backward nodes, "
                                                    rf"this monet makes {nodes[0]} and {nodes[1]}.*re-solve"):
        sol.meta.n_fwd += 1
        compat(sol, graph, nodes=nodes)


def make_solution_meta(summary):
    return SolutionMeta(model="m", batch_size=3, input_shape=(4,), dtype="float32", budget_bytes=1, mode="m",
                        device="cpu", cost_source="analytic", predicted_peak_bytes=1, eager_peak_bytes=2,
                        objective_s=1.0, bound_s=None, gap=None, solve_time_s=0.1, status="heuristic",
                        solver="chen-sqrt", torch_version="x", monet_version="y", fingerprint="0" * 64,
                        graph_summary=summary, n_fwd=1, n_bwd=1)


# --- describe -----------------------------------------------------------------------------------

def test_describe(graph):
    text = describe(make_solution(graph))
    for part in ["mlp", "batch 3", "budget 6.00 GiB", "predicted peak 5.00 GiB", "8.00 GiB", "(0.62x)",
                 "overhead +5.00 %", "time_limit", "gap 4.76 %", "CBC", "2 recomputations", "created 20"]:
        assert part in text, (part, text)
    meta = make_solution_meta(["a"])
    sol = Solution(Schedule((), [Stage(0)]), np.zeros((1, 1), bool), np.zeros((1, 1), bool), meta)
    text = describe(sol)
    assert "gap unknown" in text and "overhead unknown" in text
