"""`monet.compat`: the one module that touches PyTorch's private APIs, and its entries."""
from __future__ import annotations

import ast
import contextlib
import pathlib
import warnings

import pytest
import torch

from monet import compat

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the library's folders (docs/design.md, "Layout") and the scripts that ship beside it
CHECKED = ("monet", "solver", "profiling", "zoo", "benchmarks", "examples")
#: private modules only monet/compat/ may use
PRIVATE = ("torch._functorch", "torch._dynamo", "torch._inductor", "torch._guards", "torch._subclasses",
           "torch._C._dynamo", "torch._C._profiler", "functorch", "torch.fx.graph._BoxedCodeGen")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every import of a `PRIVATE` module and every attribute chain into one
    (``torch._dynamo.reset()``) in ``source``; docstrings and comments do not count."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node) or ""]
        found += [(node.lineno, n) for n in names if any(n == p or n.startswith(p + ".") for p in PRIVATE)]
    return found


def test_private_apis_only_in_compat():
    offenders = []
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ROOT / "monet" / "compat" in path.parents:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in private_uses(path.read_text())]
    assert not offenders, "private torch APIs outside monet/compat/:\n" + "\n".join(sorted(set(offenders)))


def test_the_check_sees_imports_and_attribute_chains():
    src = ('"""torch._dynamo.export in a docstring does not count"""\n'
           "import torch._dynamo\nfrom torch._functorch.partitioners import _is_primal\n"
           "from torch.fx.graph import _BoxedCodeGen\nx = torch._inductor.config\n# torch._guards in a comment\n")
    lines = sorted({line for line, _ in private_uses(src)})
    assert lines == [2, 3, 4, 5]


def test_version_range_matches_setup():
    text = (ROOT / "setup.py").read_text()
    lo, hi = compat.SUPPORTED
    assert f'"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}"' in text
    assert compat.check_version(), f"the suite runs on torch {torch.__version__}, outside {compat.SUPPORTED}"


def test_check_version_warns_outside_the_range(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    compat.check_version.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="tested with torch 2.11 to 2.15"):
            assert not compat.check_version()
    finally:
        monkeypatch.undo()
        compat.check_version.cache_clear()


@pytest.fixture
def mixed_tf32_settings():
    """The per-operator TF32 setting for convolutions only: torch.backends.cudnn.flags() raises
    then ("a mix of the legacy and new APIs"), on 2.11 through 2.15."""
    before = torch.backends.cudnn.conv.fp32_precision
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    yield
    torch.backends.cudnn.conv.fp32_precision = before


def test_backend_flags_set_and_restore_without_touching_precision(mixed_tf32_settings):
    was = torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic, torch.backends.mkldnn.enabled
    with compat.backend_flags("cudnn", enabled=not was[0], benchmark=None, deterministic=True):
        assert torch.backends.cudnn.enabled == (not was[0]) and torch.backends.cudnn.deterministic
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
        with compat.backend_flags("mkldnn", enabled=False):
            assert not torch.backends.mkldnn.enabled
        assert torch.backends.mkldnn.enabled == was[2]
    assert (torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic) == was[:2]
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    with pytest.raises(ValueError, match="allow_tf32"):
        with compat.backend_flags("cudnn", allow_tf32=False):
            pass


def test_conv_variants_run_with_per_operator_tf32_settings(mixed_tf32_settings):
    """The conv implementations set backend flags around the op; on torch 2.11 they passed
    ``depthwise_kernel`` to torch.backends.cudnn.flags(), which 2.11 does not take, and on every
    release flags() raises once a user sets conv TF32 on its own."""
    from monet.impls.conv import (convolution_cudnn_deterministic, convolution_native, convolution_no_cudnn)

    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    ref = torch.ops.aten.convolution.default(*args)
    for fn in (convolution_native, convolution_cudnn_deterministic, convolution_no_cudnn):
        torch.testing.assert_close(fn(*args), ref, rtol=1e-4, atol=1e-5)


def test_strict_fp32_sets_and_restores():
    before = torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    with compat.strict_fp32():
        assert compat.numerics()["cudnn_conv_fp32_precision"] == "ieee"
        assert compat.numerics()["cuda_matmul_fp32_precision"] == "ieee"
    assert (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision) == before


def test_allocation_events_see_a_cpu_allocation():
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            t = torch.empty(1 << 20, dtype=torch.uint8)
            del t
    sizes = [b for _, b, _, dev in compat.allocation_events(prof) if dev == "cpu"]
    assert (1 << 20) in sizes and -(1 << 20) in sizes


def test_gradient_comparisons_run_in_full_fp32_on_cuda_only(mixed_tf32_settings, monkeypatch):
    """`measure.compare_gradients` runs both sides under `measure.comparison_numerics` of the inputs'
    device: TF32 off on CUDA (conv TF32 is torch's default there), nothing changed on the CPU."""
    from monet.profiling import measure

    torch.backends.cudnn.conv.fp32_precision = "tf32"
    before = compat.numerics()
    with measure.comparison_numerics("cuda:0"):
        assert compat.numerics()["cudnn_conv_fp32_precision"] == "ieee"
        assert compat.numerics()["cuda_matmul_fp32_precision"] == "ieee"
    assert compat.numerics() == before
    with measure.comparison_numerics("cpu"):
        assert compat.numerics() == before
    seen = []
    monkeypatch.setattr(measure, "comparison_numerics", lambda device: seen.append(str(device)) or contextlib.nullcontext())
    model = torch.nn.Linear(3, 2)
    measure.compare_gradients(lambda: model, lambda: model, torch.randn(4, 3), torch.randn(4, 2))
    assert seen == ["cpu"]
