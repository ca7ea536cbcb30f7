"""Peak-memory measurement (monet.profiling.peak) against known byte counts."""
import pytest
import torch

from monet.profiling.peak import (
    PeakMemory,
    cpu_allocation_events,
    live_tensor_bytes,
    measure_peak,
    measure_peak_dispatch,
)

F32 = 4
TOL = 1024  # < 1 KiB: allocator alignment, tiny scalar tensors


def _close(actual: int, expected: int, tol: int = TOL) -> bool:
    return abs(actual - expected) < tol


# ---------------------------------------------------------------------------------------------
# live_tensor_bytes
# ---------------------------------------------------------------------------------------------


def test_live_bytes_dedupes_views_and_counts_whole_storage():
    x = torch.empty(1000)
    assert live_tensor_bytes(x) == 4000
    assert live_tensor_bytes(x, x[10:20], x.view(10, 100), [x.view(100, 10).t()]) == 4000
    assert live_tensor_bytes(x[10:20]) == 4000  # a view keeps its whole storage alive
    y = torch.empty(10, dtype=torch.float64)
    assert live_tensor_bytes({"a": [x, (y,)]}) == 4080
    assert live_tensor_bytes(torch.empty(0)) == 0


def test_live_bytes_module_params_buffers_grads_optimizer():
    m = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.BatchNorm1d(20))
    params = (10 * 20 + 20 + 20 + 20) * F32
    buffers = (20 + 20) * F32 + 8  # running mean/var, num_batches_tracked (int64)
    assert live_tensor_bytes(m) == params + buffers
    m(torch.randn(4, 10)).sum().backward()
    assert live_tensor_bytes(m) == 2 * params + buffers
    opt = torch.optim.Adam(m.parameters())
    opt.step()
    # Adam: exp_avg + exp_avg_sq per parameter, plus a float32 'step' scalar per parameter
    n_params = len(list(m.parameters()))
    assert live_tensor_bytes(m, opt) == 4 * params + buffers + n_params * F32
    assert live_tensor_bytes(m, device="cpu") == 2 * params + buffers
    assert live_tensor_bytes(m, device="meta") == 0


# ---------------------------------------------------------------------------------------------
# CPU allocator-level peak
# ---------------------------------------------------------------------------------------------


def test_cpu_known_allocation_and_free():
    keep = torch.empty(250_000)  # live before and during the call
    baseline = live_tensor_bytes(keep)
    assert baseline == 1_000_000

    def fn():
        a = torch.empty(1_000_000, dtype=torch.float32)
        del a
        b = torch.empty(500_000, dtype=torch.float32)
        return b

    r = measure_peak(fn, "cpu", baseline_bytes=baseline)
    assert isinstance(r, PeakMemory)
    assert r.device == "cpu" and r.reserved_bytes is None
    assert r.baseline_bytes == baseline
    assert _close(r.peak_bytes, baseline + 4_000_000), r
    assert _close(r.delta_bytes, 4_000_000)


def test_cpu_frees_are_applied_so_peak_is_not_the_sum():
    def fn():
        for _ in range(5):
            a = torch.empty(1_000_000)
            del a

    r = measure_peak(fn, "cpu")
    assert r.baseline_bytes == 0
    assert _close(r.peak_bytes, 4_000_000), r  # not 20 MB


def test_cpu_exact_event_sizes():
    """The profiler reports the requested sizes exactly (no rounding to the 64-byte alignment)."""
    events = cpu_allocation_events(lambda: torch.empty(1001, dtype=torch.uint8))
    assert [n for _, n, _ in events] == [1001, -1001]


def test_cpu_elementwise_chain():
    x = torch.randn(500_000)
    xb = x.numel() * F32

    def fn():
        a = x * 2
        b = a * 2
        del a
        c = b * 2
        return c

    r = measure_peak(fn, "cpu", baseline_bytes=live_tensor_bytes(x))
    # at most two intermediates of x's size live at once (a+b, then b+c)
    assert _close(r.peak_bytes, xb + 2 * xb), r


def test_cpu_preexisting_free_is_not_counted():
    """Frees of memory live before the call are dropped: the peak is conservative."""
    holder = [torch.empty(1_000_000)]
    baseline = live_tensor_bytes(holder)

    def fn():
        holder.pop()
        b = torch.empty(250_000)
        return b

    r = measure_peak(fn, "cpu", baseline_bytes=baseline)
    assert r.peak_bytes == baseline + 1_000_000


def test_cpu_matmul_peak_at_least_output():
    a = torch.randn(512, 1024)
    b = torch.randn(1024, 256)
    baseline = live_tensor_bytes(a, b)
    out_bytes = 512 * 256 * F32
    r = measure_peak(lambda: a @ b, "cpu", baseline_bytes=baseline)
    assert r.peak_bytes >= baseline + out_bytes
    assert r.peak_bytes < baseline + out_bytes + 4 * (a.numel() + b.numel()) * F32  # sane


def test_cpu_conv_forward_backward_sees_outputs_and_more():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1)
    x = torch.randn(4, 16, 28, 28, requires_grad=True)
    act = x.numel() * F32

    def fn():
        y = conv(x)
        y.sum().backward()

    fn()  # warm up (first-call allocations, oneDNN primitive caches)
    conv.zero_grad(set_to_none=True)
    x.grad = None
    baseline = live_tensor_bytes(conv, x)
    r = measure_peak(fn, "cpu", baseline_bytes=baseline)
    # at least: y (act) alive while grad_y (act) and grad_x (act) are produced
    assert r.peak_bytes >= baseline + 3 * act
    conv.zero_grad(set_to_none=True)
    x.grad = None
    d = measure_peak_dispatch(fn)
    assert d >= 2 * act  # y and grad_x (grad_y is an expanded scalar: no storage)
    # the dispatch tracker sees only op outputs: never more than the allocator saw
    assert d <= r.delta_bytes + TOL


# ---------------------------------------------------------------------------------------------
# dispatch-mode cross-check
# ---------------------------------------------------------------------------------------------


def test_dispatch_known_allocation():
    def fn():
        a = torch.empty(1_000_000)
        del a
        b = torch.empty(500_000)
        return b

    assert measure_peak_dispatch(fn) == 4_000_000


def test_dispatch_ignores_views_and_inplace():
    x = torch.randn(1000)

    def fn():
        v = x.view(10, 100)
        x.mul_(2)
        t = v.t()
        return t

    assert measure_peak_dispatch(fn) == 0


@pytest.mark.parametrize("n", [1000, 300_000])
def test_dispatch_agrees_with_profiler_on_elementwise_chains(n):
    x = torch.randn(n)
    y = torch.randn(n)

    def fn():
        a = x + y
        b = a * y
        del a
        c = b.exp()
        d = c - b
        del b
        e = torch.relu(d)
        return e, c

    p = measure_peak(fn, "cpu").peak_bytes
    d = measure_peak_dispatch(fn)
    assert d == 3 * n * F32
    assert _close(p, d), (p, d)


def test_dispatch_agrees_with_profiler_with_python_scalars():
    x = torch.randn(200_000)

    def fn():
        a = x * 2
        b = a * 2
        del a
        c = b * 2
        return c

    p = measure_peak(fn, "cpu").peak_bytes
    d = measure_peak_dispatch(fn)
    assert d == 2 * x.numel() * F32
    assert _close(p, d), (p, d)  # the profiler also sees tiny wrapped-scalar tensors


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_known_allocation_and_free():
    keep = torch.empty(250_000, device="cuda")
    torch.cuda.synchronize()

    def fn():
        a = torch.empty(1_000_000, dtype=torch.float32, device="cuda")
        del a
        b = torch.empty(500_000, dtype=torch.float32, device="cuda")
        return b

    r = measure_peak(fn, "cuda")
    assert r.device.startswith("cuda")
    assert r.baseline_bytes == torch.cuda.memory_allocated() >= live_tensor_bytes(keep)
    # the caching allocator rounds blocks up to 512 bytes
    assert _close(r.peak_bytes, r.baseline_bytes + 4_000_000), r
    assert r.reserved_bytes is not None and r.reserved_bytes >= r.peak_bytes


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_elementwise_chain_matches_dispatch():
    x = torch.randn(1_000_000, device="cuda")
    xb = x.numel() * F32

    def fn():
        a = x * 2
        b = a * 2
        del a
        c = b * 2
        return c

    r = measure_peak(fn, "cuda")
    assert _close(r.delta_bytes, 2 * xb), r
    assert measure_peak_dispatch(fn) == 2 * xb
