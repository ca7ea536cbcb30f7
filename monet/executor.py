"""The executor: turn a `Schedule` into AOTAutograd forward and backward graph modules.

Given the joint graph of a model and a schedule, `build_modules` produces

* the **forward module**: the whole forward pass, returning the model's outputs followed by the
  tensors the schedule keeps for the backward pass (``Schedule.saved``);
* the **backward module**: for each backward stage, the recomputations the stage needs (each a
  fresh FX node: the forward op copied from the joint graph), then the stage's backward node;
  forward values a stage releases are not referenced afterwards.

A value the schedule offloads (`Schedule.offload`, `monet.offload`) is copied to the host after its
last forward use and saved as that host copy; the backward module copies it back at the start of its
prefetch stage and waits for the copy where it is first read.

FX frees every value after its last use, and the backward module uses the boxed calling
convention, so the kept tensors are freed inside the backward pass, after their last use, instead
of at its end.  `monet.simulate` replays the same two modules to predict the peak.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from monet import compat
from monet.graph import OpGraph, TANGENT, is_alias
from monet import offload as offload_ops
from monet.inplace import make_inplace
from monet.rng import STATE_PREFIX, Replay, random_op_device, rng_state, state_meta
from monet.solution import Schedule
from monet.steps import BACKWARD, FORWARD, FREE, KEEP, OFFLOAD, PREFETCH, RECOMPUTE


class ScheduleError(ValueError):
    """The schedule cannot run: a stage reads a forward value that is neither kept nor recomputed
    (`check_steps`)."""


def _by_name(joint: fx.GraphModule) -> dict[str, fx.Node]:
    return {n.name: n for n in joint.graph.nodes}


#: Python values a node's ``meta["val"]`` may hold that are the same in every run of the graph: an
#: op's int, float or bool output under static shapes, None for an undefined tensor.
_CONSTANT_TYPES = (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
_SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_constant(node: fx.Node) -> bool:
    """True for a node whose traced value (``meta["val"]``) is a Python constant: an int, float,
    bool, None (an undefined tensor) ..., the same in every run of the graph.

    CUDA's fused attention kernels return such values among their outputs
    (``_scaled_dot_product_flash_attention``: ``max_q``, ``max_k`` ints under static shapes,
    ``cum_seq_q``, ``cum_seq_k`` undefined, None), and their backward reads them.  The backward
    module takes them as constants: AOTAutograd's runtime saves only tensors and SymInts for the
    backward pass (torch 2.11 failed on an int among the saved tensors in its donated-buffer
    analysis, 2.13 in ``save_from_forward``).  A SymInt is not a constant (`is_symbolic`); a node
    without a traced value is none."""
    if "val" not in node.meta:
        return False
    val = node.meta["val"]
    return val is None or isinstance(val, _CONSTANT_TYPES)


def is_symbolic(node: fx.Node) -> bool:
    """True for a node whose traced value is a SymInt, SymFloat or SymBool (dynamic shapes): saved
    for the backward pass where AOTAutograd takes them, after the tensors."""
    return isinstance(node.meta.get("val"), _SYMBOLIC_TYPES)


class _BackwardEmitter:
    """The state of one `emit_backward`: the backward FX graph being written (``body``), its
    placeholders and the saved values they stand for, the forward values each stage can read
    (``available``: forward node id -> joint name -> body node) and the values every stage can
    (``permanent``: primals, tangents, backward values and their views)."""

    def __init__(self, graph: OpGraph, schedule: Schedule):
        self.graph, self.schedule = graph, schedule
        self.nodes = _by_name(graph.joint)
        self.fwd_of = graph.fwd_node_of()
        self.body = fx.Graph()
        self.placeholders: dict[str, fx.Node] = {}
        self.saved: list[str] = []
        self.permanent: dict[str, fx.Node] = {}
        self.stage, self.reader = -1, ""  # the stage being emitted and the node reading, for errors
        # the segment being emitted (`monet_segment`): a stage that recomputes is a segment of its
        # own, and a run of stages that recompute nothing is one segment
        self.segment, self.segment_stage, self.segment_recomputes = 0, None, False
        self.steps = schedule.steps()
        # forward values kept from the forward pass become placeholders when first read
        self.kept_from_forward = {s.node for s in self.steps if s.kind == KEEP and s.stage == FORWARD}
        self.available: dict[int, dict[str, fx.Node]] = {i: {} for i in self.kept_from_forward}
        # offloaded values (`monet.offload`): a host placeholder and the copy back at the start of
        # their prefetch stage, if the schedule still keeps their node then
        self.offloaded = {s.value for s in self.steps if s.kind == OFFLOAD}
        self.prefetch_stage = {s.value: s.stage for s in self.steps if s.kind == PREFETCH}
        self.prefetched: dict[str, fx.Node] = {}

    def placeholder(self, name: str):
        """The body's placeholder of joint value ``name`` (saved unless a tangent), or the value
        itself where it is a Python constant (`is_constant`)."""
        node = self.nodes[name]
        if is_constant(node):  # the same in every run: a constant of the backward graph
            return node.meta["val"]
        if name not in self.placeholders:
            p = self.body.placeholder(name)
            p.meta = dict(node.meta)
            self.placeholders[name] = p
            if not name.startswith(TANGENT):
                self.saved.append(name)
        return self.placeholders[name]

    def owner_id(self, n: fx.Node) -> int | None:
        """The forward node whose value ``n`` is (or is a view of), or None."""
        r = self.nodes[self.graph.alias_root.get(n.name, n.name)]
        if r.op == "call_function" and r.target is operator.getitem:
            r = r.args[0]
        return self.fwd_of.get(r.name)

    def lookup(self, n: fx.Node) -> fx.Node:
        """The body node that stands for joint node ``n`` where the current stage reads it.

        Raises:
            ScheduleError: ``n`` is a forward value the schedule neither keeps nor recomputes here.
        """
        if n.name in self.permanent:
            return self.permanent[n.name]
        fid = self.owner_id(n)
        if fid is not None:
            return self._forward_value(n, fid)
        if n.op == "placeholder":
            self.permanent[n.name] = self.placeholder(n.name)
        elif n.op == "get_attr":  # a constant lifted into the graph (Swin's relative position index ...)
            self.permanent[n.name] = self.body.node_copy(n)
        elif is_alias(n):  # view of a primal, tangent or backward value
            self.permanent[n.name] = self.body.node_copy(n, self.lookup)
        else:
            raise ScheduleError(f"{n.name} is read before it is computed")
        return self.permanent[n.name]

    def _forward_value(self, n: fx.Node, fid: int) -> fx.Node:
        """`lookup` of a value of forward node ``fid``: recomputed in this stage, kept (a saved
        placeholder, or the copy back of an offloaded value), or a view of either."""
        env = self.available.get(fid)
        if env is None:
            raise ScheduleError(
                f"backward stage {self.stage}: {self.reader} reads {n.name} (forward node {fid}, "
                f"{self.graph.fwd[fid].op}) but the schedule neither keeps nor recomputes it: keep forward "
                f"node {fid} or recompute it earlier in the stage")
        if n.name in env:
            return env[n.name]
        if fid in self.kept_from_forward and n.name in self.graph.fwd[fid].saved:
            if n.name in self.offloaded:  # on the host until its prefetch stage (`monet.offload`)
                if n.name not in self.prefetched:
                    raise ScheduleError(f"backward stage {self.stage}: {self.reader} reads {n.name}, "
                                        f"which the schedule offloads to the host until stage "
                                        f"{self.prefetch_stage.get(n.name, len(self.schedule.stages))}")
                env[n.name] = self.body.call_function(offload_ops.fetched, (self.prefetched[n.name],))
                env[n.name].meta = {"val": self.nodes[n.name].meta.get("val"), "monet": ("offload", fid)}
            else:  # a kept value: saved by the forward only if some stage reads it
                env[n.name] = self.placeholder(n.name)
            return env[n.name]
        if is_alias(n):  # a view of a kept value: recreate it (no memory)
            env[n.name] = self.body.node_copy(n, self.lookup)
            return env[n.name]
        # an output of a kept node that was not kept: a schedule error
        raise ScheduleError(f"backward stage {self.stage}: {self.reader} reads {n.name}, which "
                            f"forward node {fid} ({self.graph.fwd[fid].op}) does not keep")

    def replay_random(self, n: fx.Node, arg) -> fx.Node:
        """Random op ``n`` again, drawing from the generator state the forward pass saved before it
        ran (`monet.rng`), which it saves as ``STATE_PREFIX + n.name``."""
        name = STATE_PREFIX + n.name
        device = random_op_device(n)
        if name not in self.placeholders:
            p = self.body.placeholder(name)
            p.meta = {"val": state_meta(device)}
            self.placeholders[name] = p
            self.saved.append(name)
        copy = self.body.call_function(Replay(n.target, device),
                                       (self.placeholders[name],) + tuple(fx.map_arg(n.args, arg)),
                                       dict(fx.map_arg(n.kwargs, arg)))
        copy.meta = dict(n.meta)
        return copy

    def saved_draw(self, fnode) -> dict[str, fx.Node]:
        """A random forward node's values where a compiled step recomputes it: each tensor it
        returns saved by the forward pass as ``STATE_PREFIX + name`` and read back here, not drawn
        again (a generator cannot be replayed inside Inductor's kernels; docs/design.md, "Note
        [Random ops compiled]")."""
        env = {}
        for name in fnode.fx_names:
            node = self.nodes[name]
            if not isinstance(node.meta.get("val"), torch.Tensor):
                continue  # the op's tuple: only its elements are read
            key = STATE_PREFIX + name
            if key not in self.placeholders:
                p = self.body.placeholder(key)
                p.meta = dict(node.meta)
                self.placeholders[key] = p
                self.saved.append(key)
            env[name] = self.placeholders[key]
        return env

    def prefetch(self, v: str) -> None:
        """The copy back of offloaded value ``v`` from the host, if its node is still kept."""
        fid = self.owner_id(self.nodes[v])
        if fid in self.kept_from_forward and not is_constant(self.nodes[v]):
            host = self.placeholder(v)
            host.meta["monet_host"] = True
            val = self.nodes[v].meta["val"]
            self.prefetched[v] = self.body.call_function(offload_ops.prefetch,
                                                         (host, tuple(val.shape), val.dtype, str(val.device)))
            self.prefetched[v].meta = {"val": val, "monet": ("offload", fid)}

    def recompute(self, i: int) -> None:
        """Forward node ``i`` again (each recomputed value a fresh node), readable from here on."""
        fnode = self.graph.fwd[i]
        self.reader = f"recomputing forward node {i} ({fnode.op})"
        if fnode.random and self.graph.compiled:
            self.available[i] = self.saved_draw(fnode)
            self.kept_from_forward.discard(i)
            return
        env: dict[str, fx.Node] = {}
        if self.segment_stage != self.stage:  # the stage's first recomputation
            self.segment, self.segment_stage, self.segment_recomputes = self.segment + 1, self.stage, True

        def arg(a: fx.Node) -> fx.Node:
            return env[a.name] if a.name in env else self.lookup(a)

        for name in fnode.fx_names:
            if fnode.random and name == fnode.name:
                copy = self.replay_random(self.nodes[name], arg)
            else:
                copy = self.body.node_copy(self.nodes[name], arg)
            copy.meta["monet"] = ("fwd", i) if name == fnode.name else ("alias", i)
            copy.meta["monet_stage"], copy.meta["monet_segment"] = self.stage, self.segment
            env[name] = copy
        self.available[i] = env
        self.kept_from_forward.discard(i)

    def backward(self, t: int) -> None:
        """Backward node ``t`` (its values readable by every later stage)."""
        bnode = self.graph.bwd[t]
        self.reader = f"backward node {bnode.id} ({bnode.op})"
        if self.segment_stage != self.stage and self.segment_recomputes:  # the first stage after a recomputing one
            self.segment, self.segment_recomputes = self.segment + 1, False
        for name in bnode.fx_names:
            copy = self.body.node_copy(self.nodes[name], self.lookup)
            copy.meta["monet"] = ("bwd", bnode.id) if name == bnode.name else ("alias", bnode.id)
            copy.meta["monet_stage"], copy.meta["monet_segment"] = self.stage, self.segment
            self.permanent[name] = copy

    def free(self, i: int) -> None:
        """Forward node ``i``'s values are not read after this point."""
        self.available.pop(i, None)
        self.kept_from_forward.discard(i)

    def finish(self) -> tuple[fx.Graph, list[str], dict[str, fx.Node]]:
        """`emit_backward`'s answer: prefetches nothing read dropped (their node recomputed where
        it is read: neither offloaded nor saved), the parameter gradients as the output."""
        for v, copy in self.prefetched.items():
            if not copy.users:
                host = copy.args[0]
                self.body.erase_node(copy)
                self.body.erase_node(host)
                self.saved.remove(v)
                del self.placeholders[v]
        out = next(n for n in self.graph.joint.graph.nodes if n.op == "output")
        self.reader = "the parameter gradients' output"
        grads = list(out.args[0])[self.graph.num_fwd_outputs:]
        self.body.output(tuple(self.lookup(g) if isinstance(g, fx.Node) else g for g in grads))
        return self.body, self.saved, self.placeholders


def emit_backward(graph: OpGraph, schedule: Schedule) -> tuple[fx.Graph, list[str], dict[str, fx.Node]]:
    """Build the backward FX graph of `schedule` and list the forward tensors it needs saved.

    It reads the schedule's steps (`Schedule.steps`): the forward pass's keeps, and each stage's
    prefetches, recomputations, backward node and frees, in order (`_BackwardEmitter`).

    Returns:
        (body, saved, placeholders): ``body`` has one placeholder per name in ``saved`` plus the
        tangents it reads, in the order they were first needed; ``saved`` are joint-graph names of
        the values the forward must hand over (kept forward values and the primals the backward
        reads); ``placeholders`` maps those joint names to the body's placeholder nodes.  A kept
        value whose traced value is a Python constant (`is_constant`: an int, None ...) is not
        saved: ``body`` reads the constant.  Each node copied for a recomputation or a backward
        node carries ``meta["monet"]`` (``("fwd", i)``, ``("bwd", id)``, ``("alias", ...)`` for
        its views and getitems), ``meta["monet_stage"]``, the stage it runs in, and
        ``meta["monet_segment"]``, its segment: a stage that recomputes a node is a segment of
        its own, and a run of stages that recompute nothing is one.  The compiled step's fusion
        rules read them (`monet.compiled.same_stage`, `monet.compiled.near_stages`, and where it
        is pinned `monet.compiled.one_segment` and `monet.compiled.realize_across_segments`).

    Raises:
        ScheduleError: a stage reads a value the schedule neither keeps nor recomputes.

    A random op (dropout) the schedule recomputes runs with the generator state saved before it ran
    in the forward pass (`monet.rng`): ``saved`` then also names that state, as
    ``monet.rng.STATE_PREFIX`` + the op's FX name, and ``placeholders`` maps it.
    """
    emitter = _BackwardEmitter(graph, schedule)
    emit = {PREFETCH: lambda s: emitter.prefetch(s.value), RECOMPUTE: lambda s: emitter.recompute(s.node),
            BACKWARD: lambda s: emitter.backward(s.node), FREE: lambda s: emitter.free(s.node)}
    for step in emitter.steps:
        if step.stage != FORWARD and step.kind in emit:
            emitter.stage = step.stage
            emit[step.kind](step)
    return emitter.finish()


def check_steps(graph: OpGraph, schedule: Schedule) -> None:
    """Raise `ScheduleError` (a ValueError) unless every step of ``schedule`` can run on ``graph``.

    Node ids must exist in the graph, and every recompute step and every backward step must find
    the forward values it reads computed earlier in its stage or kept (from the forward pass or an
    earlier stage, not yet freed; an offloaded value only from its prefetch stage on).  The check
    is the executor's own: it emits the backward graph (`emit_backward`) and discards it, so a
    schedule it accepts is one the executor runs.  The message names the stage, the node reading
    (recomputed forward node or backward node) and the value it misses.

    Raises:
        ScheduleError: the first step that cannot run; what to keep or recompute instead.
    """
    T, N = len(graph.bwd), len(graph.fwd)
    if len(schedule.stages) != T:
        raise ScheduleError(f"the schedule has {len(schedule.stages)} backward stages, the graph {T} backward "
                            f"nodes: it was made for another graph; re-solve it")
    for step in schedule.steps(N):
        bound = T if step.kind in (BACKWARD, PREFETCH) else N
        if not 0 <= step.node < bound:
            where = "the forward pass" if step.stage == FORWARD else f"backward stage {step.stage}"
            raise ScheduleError(f"{where}: {step.kind} step names node {step.node}, but the graph has {bound} "
                                f"{'backward' if bound == T else 'forward'} nodes: the schedule was made for "
                                f"another graph; re-solve it")
    emit_backward(graph, schedule)


#: the options the wrapper builds its modules with (`build_modules`): what runs, and what a per-node
#: trace (`monet.profiling.trace`) records and replays
RUNTIME = {"buffers_in_place": True}


def build_modules(graph: OpGraph, schedule: Schedule,
                  buffers_in_place: bool = False) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules for AOTAutograd's runtime (``partition_fn``'s result): the
    graphs of `build_graphs` with their Python code generated.

    Raises:
        ScheduleError: see `emit_backward`.
    """
    fw_graph, bw_graph = build_graphs(graph, schedule, buffers_in_place)
    return fx.GraphModule(graph.joint, fw_graph), fx.GraphModule(graph.joint, bw_graph)


def build_graphs(graph: OpGraph, schedule: Schedule, buffers_in_place: bool = False) -> tuple[fx.Graph, fx.Graph]:
    """The forward and backward FX graphs of `build_modules` without their generated code (what
    the simulator reads: generating a 96-layer GPT-2's code took 1.5 s a schedule).

    The forward module computes the forward outputs and then returns the saved values in the
    order AOTAutograd's runtime takes them: tensors checked for in-place changes, generator states
    (`monet.rng`), tensors stashed without that check (buffers the forward mutates and their new
    values), then SymInts (dynamic shapes; `is_symbolic`).  The backward module is `emit_backward`'s graph; its placeholders are
    the SymInts, the saved tensors in the same order, then the tangents (AOTAutograd's backward
    calling convention).  Python constants the backward reads are baked into it (`is_constant`).

    ``buffers_in_place``: the forward module updates BatchNorm's running statistics in place
    (`update_buffers_in_place`), as the wrapper runs it; False (the simulator's and the tests'
    view): AOTAutograd's functional form, which allocates their new values (a few KiB more).

    Raises:
        ScheduleError: see `emit_backward`.
    """
    joint = graph.joint
    nodes = _by_name(joint)
    body, saved, ph = emit_backward(graph, schedule)
    # Buffers the forward mutates (BatchNorm's running statistics) are read again only by
    # recomputed ops that use them to compute new statistics, which are dropped, and their new
    # values only by BatchNorm's training-mode backward, which ignores them; AOTAutograd stashes
    # such tensors without the version-counter check, at the end of the saved values (updated in
    # place, a new value is the buffer itself, whose version the runtime's copy_ bumps).
    unchecked = [s for s in saved
                 if graph.primal_kinds.get(s) == "buffer" or (s in nodes and _new_running_stat(nodes[s]))]
    states = [s for s in saved if s.startswith(STATE_PREFIX)]  # generator states (`monet.rng`)
    symbolic = [s for s in saved if s in nodes and is_symbolic(nodes[s])]
    checked = [s for s in saved if s not in unchecked and s not in states and s not in symbolic]
    saved = checked + states + unchecked + symbolic
    fwd_outputs, fwd_descs = compat.forward_outputs(joint, graph.num_fwd_outputs)
    primals, tangents = compat.primals_and_tangents(joint)
    # compiled: a recomputed random op's draws are saved themselves (`_BackwardEmitter.saved_draw`)
    draws = [nodes[s[len(STATE_PREFIX):]] for s in states] if graph.compiled else []
    saved_nodes = [nodes[s] for s in checked] + draws + [nodes[s] for s in unchecked + symbolic]
    fw_graph = compat.extract_subgraph(joint.graph, primals, fwd_outputs + saved_nodes,
                                       fwd_descs + compat.saved_for_backward_descs(len(saved_nodes)), "forward")
    for n in fw_graph.nodes:
        if n.name in unchecked:
            n.meta[compat.NO_VERSION_CHECK] = True
    if states and not graph.compiled:  # save each recomputed random op's generator state right before it runs
        by_name = {n.name: n for n in fw_graph.nodes}
        state_nodes = []
        for s in states:
            op = by_name[s[len(STATE_PREFIX):]]
            with fw_graph.inserting_before(op):
                state_nodes.append(fw_graph.call_function(rng_state, (random_op_device(op),)))
            state_nodes[-1].meta = dict(ph[s].meta)
        out = next(iter(fw_graph.find_nodes(op="output")))
        vals = list(out.args[0])
        at = len(fwd_outputs) + len(checked)
        vals[at:at] = state_nodes
        out.args = (tuple(vals),)
        out.meta["desc"] = fwd_descs + compat.saved_for_backward_descs(len(saved))

    host = [s for s in saved if ph[s].meta.get("monet_host")]
    if host:
        _insert_offloads(graph, schedule, fw_graph, host)
    if buffers_in_place:
        update_buffers_in_place(fw_graph, {n for n, k in graph.primal_kinds.items() if k == "buffer"})

    bw_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for name in symbolic + checked + states + unchecked + [t.name for t in tangents]:
        p = bw_graph.placeholder(name)
        p.meta = dict(ph[name].meta if name in states or name in host else nodes[name].meta)
        if name in ph:
            env[ph[name]] = p
    for n in body.nodes:
        if n.op != "placeholder":
            env[n] = bw_graph.node_copy(n, lambda a: env[a])
    drop_detaches(bw_graph)
    if schedule.inplace:
        make_inplace(fw_graph)
        make_inplace(bw_graph)
    bw_graph.set_codegen(compat.boxed_codegen())
    return fw_graph, bw_graph


_aten = torch.ops.aten


def drop_detaches(bw_graph: fx.Graph) -> int:
    """Read each ``detach`` node's input directly in the backward module; returns how many went.

    AOTAutograd's joint graph detaches the values the backward reads (ReLU's output, twice, for
    ``threshold_backward``: 100 of ResNet-50's 551 backward nodes), and the generated code would
    call each one: an ATen call of about a microsecond on the CPU for nothing, since no value in the
    backward module requires a gradient (AOTAutograd runs no double backward).  A detach is a view
    of its input to the simulator too, so its memory accounting is unchanged.  One the module
    returns is kept."""
    count = 0
    for n in list(bw_graph.nodes):
        if n.op == "call_function" and n.target is _aten.detach.default and all(u.op != "output" for u in n.users):
            n.replace_all_uses_with(n.args[0])
            bw_graph.erase_node(n)
            count += 1
    return count


def _in_place_batch_norms() -> dict:
    """Functional training BatchNorm -> (the op updating the running statistics in place, how many
    of its outputs it returns: None for all, the running statistics themselves at 3 and 4)."""
    from monet.impls.batchnorm import cudnn_batch_norm_functional, cudnn_batch_norm_inplace

    return {_aten._native_batch_norm_legit_functional.default: (_aten._native_batch_norm_legit.default, 3),
            cudnn_batch_norm_functional: (cudnn_batch_norm_inplace, None)}


def _new_running_stat(node: fx.Node) -> bool:
    """A new running mean or variance: output 3 or 4 of a functional BatchNorm
    (``_native_batch_norm_legit_functional``, `monet.impls.batchnorm.cudnn_batch_norm_functional`)."""
    return (node.op == "call_function" and node.target is operator.getitem and node.args[1] in (3, 4)
            and isinstance(node.args[0], fx.Node) and node.args[0].target in _in_place_batch_norms())


def update_buffers_in_place(fw_graph: fx.Graph, buffers: set[str]) -> int:
    """Let the forward module update BatchNorm's running statistics in place, as eager PyTorch
    does; returns how many ops it rewrote.

    AOTAutograd's graph is functional: ``_native_batch_norm_legit_functional`` copies the running
    mean and variance, updates the copies and returns them, and AOTAutograd's runtime copies each
    new value into its buffer after the forward module (``orig.copy_(new)``): per BatchNorm two
    clones and two copies that eager PyTorch does not run (small tensors: on the CPU about 5 us per
    BatchNorm layer; on a GPU four kernel launches).  Rewritten, the op is
    ``_native_batch_norm_legit`` (`monet.impls.batchnorm.cudnn_batch_norm_inplace` for cuDNN's, on CUDA)
    (updates ``running_mean`` and ``running_var`` in place), and the
    module returns the buffers themselves as their new values, which the runtime's ``copy_`` then
    skips (ATen returns early when source and destination are the same data).
    ``num_batches_tracked`` keeps its functional ``add``: ``add_`` with a Python number allocates
    an 8-byte temporary for it that no graph node shows, which would make the per-node trace
    (`monet.profiling.trace`) part from the simulator for one add per BatchNorm.  Only where the buffer (a placeholder named in ``buffers``) has no other reader in the
    module and the new value no other user than the output, so no op reads a buffer after it
    changed.  The values and the gradients are the functional graph's, bit for bit; the running
    statistics' copies are not allocated (a few KiB that the simulator, which reads the functional
    form, still counts).  Where the backward module reads a new value (BatchNorm's backward takes
    the running statistics and ignores them in training mode), it reads the buffer, saved without
    the version-counter check (`build_modules` puts new values there).
    """
    out = next(iter(fw_graph.find_nodes(op="output")))

    def sole_reader(buf, node) -> bool:
        return (isinstance(buf, fx.Node) and buf.op == "placeholder" and buf.name in buffers
                and set(buf.users) <= {node, out})

    swap: dict[fx.Node, fx.Node] = {}  # a new value returned to the runtime -> the buffer itself
    count = 0
    in_place = _in_place_batch_norms()
    for n in list(fw_graph.nodes):
        if n.op != "call_function":
            continue
        if n.target in in_place:
            target, kept = in_place[n.target]
            rm, rv = n.args[3], n.args[4]
            outs = {u.args[1]: u for u in n.users}
            if not (sole_reader(rm, n) and sole_reader(rv, n) and rm is not rv
                    and all(set(outs[i].users) <= {out} for i in (3, 4) if i in outs)):
                continue
            with fw_graph.inserting_before(n):
                new = fw_graph.call_function(target, n.args, n.kwargs)
            new.meta = {k: v for k, v in n.meta.items() if k != "val"}
            if isinstance(n.meta.get("val"), (tuple, list)):
                new.meta["val"] = tuple(n.meta["val"][:kept])
            for i, u in outs.items():
                if i not in (3, 4):
                    u.args = (new, i)
                else:
                    swap[u] = rm if i == 3 else rv
                    if u.meta.get(compat.NO_VERSION_CHECK):
                        swap[u].meta[compat.NO_VERSION_CHECK] = True
            count += 1
    if swap:
        out.args = (tuple(swap.get(v, v) for v in out.args[0]),)
        for u in swap:
            fw_graph.erase_node(u)
        for n in list(fw_graph.nodes):
            if n.target in in_place and not n.users:
                fw_graph.erase_node(n)
    return count


def _insert_offloads(graph: OpGraph, schedule: Schedule, fw_graph: fx.Graph, host: list[str]) -> None:
    """Rewrite the forward graph for the offloaded values ``host`` (`monet.offload`): ``offload``
    after the last forward use of the value's storage, ``offload_done`` after forward node
    ``release`` of its `Schedule.offload` entry (or at the end of the forward pass), and the host
    copy instead of the value among the saved outputs."""
    release = {s.value: s.node for s in schedule.steps() if s.kind == OFFLOAD}
    order = list(fw_graph.nodes)
    pos = {n: k for k, n in enumerate(order)}
    by_name = {n.name: n for n in order}
    out = next(iter(fw_graph.find_nodes(op="output")))
    for name in host:
        value = by_name[name]
        aliases = {value}
        for n in order[pos[value] + 1:]:
            if is_alias(n) and n.args and n.args[0] in aliases:
                aliases.add(n)
        users = [pos[u] for a in aliases for u in a.users if u.op != "output"]
        last = order[max(users + [max(pos[a] for a in aliases)])]
        r = release[name]
        anchor = None
        if r < len(graph.fwd):
            at = [pos[by_name[x]] for x in graph.fwd[r].fx_names if x in by_name]
            anchor = order[max(at)] if at else None
        with fw_graph.inserting_after(last):
            copy = fw_graph.call_function(offload_ops.offload, (value,))
        copy.meta = {"val": value.meta.get("val"), "monet": ("offload", -1)}
        if anchor is None:
            where = fw_graph.inserting_before(out)
        else:
            where = fw_graph.inserting_after(copy if pos[anchor] <= pos[last] else anchor)
        with where:
            done = fw_graph.call_function(offload_ops.offload_done, (copy, value))
        done.meta = {"val": value.meta.get("val"), "monet": ("offload", -1)}
        vals = list(out.args[0])
        out.args = (tuple(done if v is value else v for v in vals),)
