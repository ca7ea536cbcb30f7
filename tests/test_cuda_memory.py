"""`monet.profiling.cuda_bytes`: the CUDA caching allocator's rounding, the BLAS workspaces, and
the memory model (simulator and ILP) counting them for a CUDA graph, on any machine."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from ci import SHORT

from monet.capture import capture
from monet.executor import build_modules
from monet.profiling import cuda_bytes as cm
from monet.profiling.costs import analytic_costs, costs_for
from monet.matrices import schedule_from_matrices
from monet.simulate import simulate
from monet.solver import formulation
from monet.solver.repair import repair
from monet.solver.solve import memory_model
from monet.zoo.models import get_model

MiB = 2**20


def test_round_size_follows_the_caching_allocator():
    assert [cm.round_size(n) for n in (0, 1, 511, 512, 513, 1024, 1025)] == [0, 512, 512, 512, 1024, 1024, 1536]
    assert cm.round_size(3_000_000) == 3_000_320  # 5860 blocks of 512 bytes
    assert cm.pool_of(MiB) == "small" and cm.pool_of(MiB + 1) == "large"
    assert cm.split_slack_bound(4096) == 0 and cm.split_slack_bound(3 * MiB) == MiB


def test_roundup_power2_divisions():
    """roundup_power2_next_division: 3,000,000 bytes with 4 divisions between 2 MiB and 4 MiB rounds
    to 3 MiB; a power of two stays; small sizes keep the 512-byte rounding.  A list sets the interval
    that starts at each key (and the first key every interval below it), ">" those after the last."""
    div = cm.parse_roundup_divisions("expandable_segments:False,roundup_power2_divisions:4")
    assert div == [4] * cm.ROUNDUP_INTERVALS
    assert cm.round_size(3_000_000, div) == 3 * MiB
    assert cm.round_size(4 * MiB, div) == 4 * MiB
    assert cm.round_size(1000, div) == 1024
    table = cm.parse_roundup_divisions("roundup_power2_divisions:[256:1,512:2,>:8]")
    assert table == [1] * 9 + [2] + [8] * 6
    assert cm.round_size(300 * MiB + 1, table) == 300 * MiB + 512  # [256, 512) MiB: 1 division
    assert cm.round_size(600 * MiB + 1, table) == 768 * MiB  # [512, 1024) MiB: 2 divisions
    assert cm.round_size(1200 * MiB, table) == 1280 * MiB  # >= 1 GiB: 8 divisions
    assert cm.parse_roundup_divisions("roundup_power2_divisions:[64:4]") == [4] * 7 + [0] * 9
    assert cm.parse_roundup_divisions("") == []
    with pytest.raises(ValueError):
        cm.parse_roundup_divisions("roundup_power2_divisions:[x:1]")


def test_cublas_workspace_sizes():
    assert cm.cublas_workspace_bytes((9, 0), config="") == 32 * MiB  # Hopper
    assert cm.cublas_workspace_bytes((8, 0), config="") == 4096 * 1024 * 2 + 16 * 1024 * 8  # :4096:2:16:8
    assert cm.cublas_workspace_bytes(None, config="") == 32 * MiB  # unknown: the largest default
    assert cm.cublas_workspace_bytes((9, 0), config=":4096:8") == 32 * MiB
    assert cm.cublas_workspace_bytes((9, 0), config=":16:8") == 16 * 1024 * 8
    assert cm.cublas_workspace_bytes((8, 0), config=":4096:2:16:8") == 8_519_680
    assert cm.cublaslt_workspace_bytes(unified=True) == 0
    assert cm.cublaslt_workspace_bytes(unified=False, size_kib="") == MiB
    assert cm.cublaslt_workspace_bytes(unified=False, size_kib="2048") == 2 * MiB


def test_cublaslt_workspace_by_release(monkeypatch):
    """Separate in torch 2.11 (an H100 with 2.11.0+cu130: the first addmm with a bias allocated 1 MiB
    beside cuBLAS's 32 MiB), shared from 2.12; the environment variable decides when set."""
    monkeypatch.delenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    assert cm.cublaslt_workspace_bytes(release=(2, 11)) == MiB
    assert cm.cublaslt_workspace_bytes(release=(2, 12)) == 0
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "0")
    assert cm.cublaslt_workspace_bytes(release=(2, 13)) == MiB
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1")
    assert cm.cublaslt_workspace_bytes(release=(2, 11)) == 0


def test_library_workspaces_on_torch_2_11(gpt2, monkeypatch):
    """GPT-2's addmm (a bias epilogue) runs cuBLASLt in both threads: 2 x (32 MiB + 1 MiB) on 2.11;
    a bias-free product (mm) allocates no cuBLASLt workspace."""
    import monet.compat

    monkeypatch.delenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    monkeypatch.setattr(monet.compat, "torch_version", lambda: (2, 11))
    graph, _ = gpt2
    assert cm.library_workspace_bytes(graph, (9, 0)) == 2 * 33 * MiB
    nobias = capture(torch.nn.Linear(8, 8, bias=False), torch.randn(4, 8, requires_grad=True))
    assert cm.library_workspace_bytes(nobias, (9, 0)) == 2 * 32 * MiB


@pytest.fixture(scope="module")
def gpt2():
    """A tiny GPT-2 (matrix products in both passes, odd-sized LayerNorm statistics) and its costs."""
    torch.manual_seed(0)
    model = get_model("gpt2-small", n_layer=1, n_embd=32, n_head=2, vocab_size=96, n_positions=24)
    graph = capture(model, torch.randint(0, 96, (2, 24)))
    return graph, costs_for(graph, analytic_costs(graph))


def _cuda(graph, capability=(9, 0)):
    return graph.counted_on("cuda", capability)


def test_library_workspaces_once_per_pass(gpt2):
    graph, _ = gpt2
    assert cm.library_workspace_bytes(graph, (9, 0)) == 2 * 32 * MiB  # forward thread, autograd's thread
    conv = capture(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()), torch.randn(2, 3, 8, 8))
    assert cm.library_workspace_bytes(conv, (9, 0)) == 0  # cuDNN only


def test_cpu_graph_counts_exact_bytes(gpt2):
    graph, _ = gpt2
    assert graph.device == "cpu"
    assert cm.sized_graph(graph) is graph
    assert cm.memory_terms(graph).block(513) == 513 and cm.memory_terms(graph).library_bytes == 0


def test_cuda_graph_counts_blocks_and_library_workspaces(gpt2):
    """The simulator of a CUDA graph: every tensor its 512-byte block, the BLAS workspaces held
    through the step; constants and every node's live bytes at least the CPU count, the constants
    exactly the rounded primals plus 64 MiB."""
    graph, costs = gpt2
    cuda = _cuda(graph)
    sched = schedule_from_matrices(graph, np.ones((len(graph.bwd), len(graph.fwd)), bool),
                                   np.zeros((len(graph.bwd), len(graph.fwd)), bool))
    fw, bw = build_modules(graph, sched)
    cpu = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace, timeline=True)
    gpu = simulate(cuda, fw, bw, costs.fwd_workspace, costs.bwd_workspace, timeline=True)
    primals = [n for n in graph.joint.graph.nodes if n.op == "placeholder"]
    rounded = sum(cm.round_size(t.untyped_storage().nbytes()) for n in primals
                  for t in ([n.meta["val"]] if isinstance(n.meta.get("val"), torch.Tensor) else []))
    assert gpu.constant_bytes == rounded + 64 * MiB
    assert gpu.constant_bytes > cpu.constant_bytes + 64 * MiB  # the rounding is there too
    assert len(gpu.timeline) == len(cpu.timeline)
    for a, b in zip(gpu.timeline, cpu.timeline):
        assert a.name == b.name and a.after_bytes >= b.after_bytes + 64 * MiB
        assert a.outputs_bytes % 512 == 0
    assert gpu.peak_bytes > cpu.peak_bytes + 64 * MiB


@pytest.fixture(scope="module")
def resnet_dropout():
    """A tiny ResNet-50 with two dropouts (random nodes: generator states saved and replayed) and its
    costs."""
    torch.manual_seed(0)
    model = get_model("resnet50", base_width=4, layers=(1, 1, 1, 1), num_classes=10)
    model.layer1 = torch.nn.Sequential(model.layer1, torch.nn.Dropout(0.1))
    model.fc = torch.nn.Sequential(torch.nn.Dropout(0.5), model.fc)
    graph = capture(model, torch.randn(4, 3, 32, 32))
    return graph, costs_for(graph, analytic_costs(graph))


def _stage_peaks(sim, bw) -> dict[int, int]:
    """Simulated peak (bytes) of each backward stage t of ``simulate(..., timeline=True)``'s result:
    the rows up to backward node t, from the one after backward node t - 1 (recomputations count in
    the stage of the next backward node)."""
    tag = {n.name: n.meta.get("monet") for n in bw.graph.nodes}
    peaks, stage = {}, None
    for row in reversed([r for r in sim.timeline if r.pass_ == "backward"]):
        kind, i = tag.get(row.name) or (None, -1)
        stage = i if kind == "bwd" else stage
        if stage is not None:
            peaks[stage] = max(peaks.get(stage, 0), row.peak_bytes)
    return peaks


@pytest.mark.parametrize("generator", ["cpu", "cuda"])
@pytest.mark.parametrize("case, n", [("gpt2", 120), ("resnet_dropout", 40)])
def test_ilp_memory_bounds_the_simulator_on_a_cuda_graph(request, case, n, generator, monkeypatch):
    """The ILP's memory model reads the same block sizes and library bytes as the simulator: it
    stays an upper bound of it on a CUDA graph, in the forward pass and in every backward stage, on
    random repaired schedules that recompute dropout.  The generator state a recomputed random node
    saves counts as the simulator counts it, a block: with the ILP at the state's own bytes, the
    tiny GPT-2's first schedule was 192 bytes over (3 states of 5,056 bytes, 5,120 in blocks) with
    the CPU generator and 1,488 over (3 x 496) with a CUDA generator's 16 bytes."""
    if generator == "cuda":  # the random nodes draw on the GPU, as in a graph traced there
        import monet.executor
        import monet.solver.memory_build

        for module in (monet.executor, monet.solver.memory_build):
            monkeypatch.setattr(module, "random_op_device", lambda node: "cuda:0")
    if SHORT:  # a third of the random schedules (50 s of CPU less on 2 cores); all with MONET_LONG_TESTS=1
        n //= 3
    graph, costs = request.getfixturevalue(case)
    cuda = _cuda(graph)
    mem, mem_cpu = memory_model(cuda, costs), memory_model(graph, costs)
    assert mem.constant - mem_cpu.constant >= 64 * MiB
    random = mem.rng_state_bytes > 0
    assert random.sum() >= 2
    assert (mem.rng_state_bytes[random] == {"cpu": 5120, "cuda": 512}[generator]).all()
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    rng = np.random.default_rng(0)
    recomputed_random = 0
    for k in range(n):
        S, R = repair(cuda, mem, rng.random((P.T, P.G)) < rng.uniform(0.05, 0.95), P.allow_s)
        recomputed_random += bool(R[:, random].any())
        fw, bw = build_modules(cuda, schedule_from_matrices(cuda, mem.group_to_node(S), R))
        sim = simulate(cuda, fw, bw, costs.fwd_workspace, costs.bwd_workspace, timeline=True)
        assert sim.constant_bytes == mem.constant  # one count of the constants
        assert sim.peak_bytes <= mem.peak(S, R) + 1, k
        assert sim.fwd_peak_bytes <= mem.fwd_peak(S[0], R=R) + 1, k
        bwd = mem.bwd_peaks(S, R)
        over = {t: p - bwd[t] for t, p in _stage_peaks(sim, bw).items() if p > bwd[t] + 1}
        assert not over, (k, over)
        if k < 3:
            cpu_sim = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace)
            assert sim.peak_bytes > cpu_sim.peak_bytes + 64 * MiB
    assert recomputed_random >= n // 2
