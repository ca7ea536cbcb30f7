"""`MONeTWrapper`: train a model with a solved schedule, as a drop-in ``nn.Module``."""
from __future__ import annotations

import contextlib
import re
from types import MappingProxyType

import torch
import torch.nn as nn

from monet.executor import RUNTIME, build_modules
from monet.capture import opgraph_of
from monet.compiled import channels_last, compilers, executor_modules
from monet.frontend import (ShardedModelError, fsdp_refusal, primal_sources, rebind, trace, tracing, training_inputs,
                            cache_owner)
from monet.graph import portable_summary
from monet import compat, mixed_precision
from monet.inputs import ExampleInputs, call_key
from monet.stack import export_stack
from monet.with_loss import WithLoss, loss_from_name
from monet.solution import (AutocastMismatchError, Schedule, Solution, SolutionMismatchError,
                            check_compatible, load_solution)


def _boxed_forward(gm, _example_inputs):
    return compat.boxed_function(gm.forward)


def _boxed_backward(gm, _example_inputs):
    return gm  # build_modules already gave it the boxed calling convention


MAX_TRACES = 16  # traced graphs a ScheduledModule keeps (full and last batch, sequence lengths, autocast settings)
MAX_CHECKED = 64  # call keys whose inputs a MONeTWrapper has checked against its solution


class ScheduledModule(nn.Module):
    """``model`` exported by Dynamo and traced by AOTAutograd, its backward executed by a schedule.

    Called like ``model``; the first call with a new input structure, shape, dtype or autocast
    setting exports and traces again (the last `MAX_TRACES` traces are kept, so alternating
    between an epoch's full and last batch traces each once).  ``monet_compiled`` holds the last trace's ``graph``,
    ``schedule``, ``fw`` and ``bw``.

    Args:
        make_schedule: called with the traced `OpGraph`, returns a `Schedule`.
        check: optional, called with the `OpGraph` before that (raise to refuse the graph).
        autocast: the autocast setting the calls run under (`monet.mixed_precision`), which the
            trace bakes into the graph; recorded in the graph's fingerprint.  AOTAutograd runs the
            traced graphs with autocast disabled (its ``disable_amp``), so the recorded casts are
            not applied a second time.  None: the setting in force at the first call.
        exported: ``{call_key: export}``: Dynamo exports to trace instead of exporting again
            (`MONeTWrapper.offer_export`), each taken once.
        transform: ``transform(gm)``, applied in place to each export before it is traced (the
            fused language-model loss, `monet.lm_loss.fuse_lm_loss`; it must do nothing to an
            export it was applied to already).
        runner: how the forward and backward modules run: ``runner(gm, "forward" | "backward")``
            returns the callable AOTAutograd calls, boxed (one list of inputs; the backward's may
            be cleared); None: the modules' own generated code.  `monet.profiling.trace` runs them
            node by node to measure each node's memory.
        compiled: compile the forward and backward modules with Inductor (`monet.compiled`);
            ``monet_compiled`` then also holds the compiled ``fw_code`` and ``bw_code`` (the
            backward's after the first backward pass).
        pinned: compiled, the backward pinned to the schedule's stages that recompute
            (`monet.compiled.compilers`).

    Raises:
        ValueError: both ``compiled`` and a ``runner``.
    """

    def __init__(self, model: nn.Module, make_schedule, check=None, autocast=None, runner=None,
                 exported: dict | None = None, transform=None, compiled: bool = False, pinned: bool = False):
        super().__init__()
        if compiled and runner is not None:
            raise ValueError("a ScheduledModule runs its modules compiled or with a runner, not both")
        self.model = model
        self._compiled = bool(compiled)
        self._pinned = bool(pinned)
        self._make_schedule = make_schedule
        self._check = check
        self._autocast = autocast
        self._runner = runner
        self._traces: dict = {}  # call_key -> traced module (a plain dict: no submodules)
        self.__dict__["_exported"] = dict(exported or {})  # call_key -> an export of the model to trace
        self.__dict__["_transform"] = transform  # applied to each export before its trace
        self.monet_compiled: dict = {}

    def forward(self, *args, **kwargs):
        inputs = _call_inputs(self, args, kwargs)
        autocast = self._autocast if self._autocast is not None else mixed_precision.current(
            inputs.first.device.type)
        return self.run(call_key(inputs, autocast), inputs, autocast)

    def run(self, key: tuple, inputs: ExampleInputs, autocast):
        """The forward call with the trace for ``key`` (`call_key` of ``inputs`` under ``autocast``),
        made first if there is none and kept once its first call (AOTAutograd's trace and compile)
        returned."""
        traced = self._traces.get(key)
        if traced is not None:
            return traced(*inputs.args, **inputs.kwargs)
        traced = self._trace(inputs, autocast, key)
        strides = compat.forward_strides_to_backward() if self._compiled else contextlib.nullcontext()
        with tracing(), strides:  # the first call traces (and compiles)
            out = traced(*inputs.args, **inputs.kwargs)
        if len(self._traces) >= MAX_TRACES:  # e.g. an epoch's last, smaller batch: kept, the next epoch needs it
            self._traces.pop(next(iter(self._traces)))
        self._traces[key] = traced
        return out

    def _trace(self, inputs: ExampleInputs, autocast, key=None):
        gm = self.__dict__["_exported"].pop(key, None)  # the capture's export, handed over once
        if gm is None:
            gm = export_stack(self.model, inputs)
        if self.__dict__["_transform"] is not None:
            self.__dict__["_transform"](gm)
        sources = primal_sources(gm, self.model, inputs)
        holder = self.monet_compiled

        compiled = self._compiled

        def partition(joint, _joint_inputs, *, num_fwd_outputs, **_):
            graph = opgraph_of(joint, num_fwd_outputs, sources, autocast).for_compile(compiled)
            if self._check is not None:
                self._check(graph)
            schedule = self._make_schedule(graph)
            if schedule.impl:
                from monet.impls import apply_impls
                graph = apply_impls(graph, schedule.impl)
            if compiled:
                fw, bw = executor_modules(graph, schedule)
            else:
                # eager PyTorch's kernels or faster ones, the same bits and memory (cuDNN's BatchNorm
                # on CUDA, fp32 dropout's backward on the CPU)
                from monet.impls import lower_for_device
                graph = lower_for_device(graph)
                fw, bw = build_modules(graph, schedule, **RUNTIME)
            holder.update(graph=graph, schedule=schedule, fw=fw, bw=bw)
            return fw, bw

        if compiled:
            def compile_module(which):
                def compile_it(m, example_inputs):
                    graph = holder["graph"]
                    fw_compile, bw_compile = compilers(graph.num_fwd_outputs, channels_last(graph), self._pinned)
                    code = (fw_compile if which == "fw" else bw_compile)(m, example_inputs)
                    holder[f"{which}_code"] = code
                    return code
                return compile_it

            return trace(gm, partition, fw_compiler=compile_module("fw"), bw_compiler=compile_module("bw"))
        if self._runner is None:
            return trace(gm, partition, fw_compiler=_boxed_forward, bw_compiler=_boxed_backward)
        runner = self._runner
        return trace(gm, partition, fw_compiler=lambda m, _inputs: runner(m, "forward"),
                     bw_compiler=lambda m, _inputs: runner(m, "backward"))

    @property
    def traces(self) -> MappingProxyType:
        """The traced graphs kept, read-only: `call_key` of the inputs -> the traced module (at most
        `MAX_TRACES`, oldest first); a call whose key is here runs its trace without tracing again."""
        return MappingProxyType(self._traces)

    def _apply(self, fn, *args, **kwargs):
        self._traces.clear()  # a new device or dtype: export and trace again on the next call
        self.__dict__["_exported"].clear()
        return super()._apply(fn, *args, **kwargs)


def scheduled_module(model: nn.Module, make_schedule, check=None, autocast=None) -> ScheduledModule:
    """``ScheduledModule(model, make_schedule, check, autocast)``: see there."""
    return ScheduledModule(model, make_schedule, check=check, autocast=autocast)


_NUMBER = re.compile(r"(?<![%\w.])\d+")


def _call_inputs(module: nn.Module, args, kwargs) -> ExampleInputs:
    """The inputs of a call of ``module.model`` (`monet.frontend.training_inputs`: ``use_cache=False``
    added in training where the forward takes it); the forward signatures are read once per
    ``module`` (`monet.frontend.cache_owner`) and kept outside its submodules and state."""
    if "_cache_owner" not in module.__dict__:
        module.__dict__["_cache_owner"] = cache_owner(module.model)
    return training_inputs(module.model, ExampleInputs(args, kwargs), module.__dict__["_cache_owner"])


def model_attribute(module: nn.Module, name: str):
    """``name`` of the model a wrapper holds (``module._modules["model"]``), for an attribute the
    wrapper itself does not have: ``config``, ``loss_type``, ``accepts_loss_kwargs``,
    ``main_input_name`` ... of a transformers model, which ``transformers.Trainer`` reads (it
    counts the tokens of a causal LM's loss from ``loss_type``, and passes ``num_items_in_batch``
    where the model takes loss arguments).  Dunder and private names are not looked up.

    Raises:
        AttributeError: neither has it."""
    model = module.__dict__.get("_modules", {}).get("model")
    if model is None or name.startswith("_"):
        raise AttributeError(f"'{type(module).__name__}' object has no attribute {name!r}")
    return getattr(model, name)


def _graph_rewrite(meta):
    """What the solution's graph did to the model's export before tracing it: the fused language
    model loss with its chunk (`monet.lm_loss`), or None."""
    from monet.lm_loss import fused, fuse_lm_loss

    chunk = fused(meta.graph_summary)
    return None if chunk is None else (lambda gm: fuse_lm_loss(gm, chunk))


def _smaller(shape, made) -> bool:
    """``shape`` has ``made``'s rank, is no larger in any dimension and differs from it."""
    shape, made = tuple(shape), tuple(made)
    return len(shape) == len(made) and shape != made and all(a <= b for a, b in zip(shape, made))


def _with_recorded_loss(model: nn.Module, meta) -> nn.Module:
    """``model`` in `monet.WithLoss` with the loss ``meta.loss`` names (the solution traced it), or
    ``model`` itself where it records none or ``model`` is a ``WithLoss`` already.

    Raises:
        SolutionMismatchError: the recorded loss cannot be imported by its name."""
    name = getattr(meta, "loss", None)
    if name is None or isinstance(model, WithLoss):
        return model
    fn = loss_from_name(name)
    if fn is None:
        raise SolutionMismatchError(
            f"the solution was solved with the loss {name} traced with the model, which cannot be imported by "
            "that name: pass the model with its loss, MONeTWrapper(WithLoss(model, loss_fn), solution) "
            "(from monet import WithLoss)")
    return WithLoss(model, fn)


def same_structure(ours: list[str], theirs: list[str]) -> bool:
    """True when two graph summaries differ at most in their sizes: the same ops in the same order
    reading the same nodes (`OpGraph.summary` lines with every number but node references blanked)."""
    ours, theirs = portable_summary(ours), portable_summary(theirs)
    return len(ours) == len(theirs) and all(_NUMBER.sub("N", a) == _NUMBER.sub("N", b)
                                            for a, b in zip(ours, theirs))


class MONeTWrapper(nn.Module):
    """Train ``model`` under a memory budget with a schedule from ``monet solve``.

    ``MONeTWrapper(model, "solution.pkl", input_shape=(3, 224, 224))`` behaves like ``model``:
    call it on a (B, *input_shape) batch, where B is the solution's batch size, then call
    ``backward`` on the loss.  In training mode with gradients enabled the forward pass keeps only
    what the schedule keeps and the backward pass recomputes the rest (MONeT, Shah et al.,
    ICLR 2021); in eval mode or under ``torch.no_grad`` it runs ``model`` as it is.  Parameters,
    buffers and ``state_dict`` are the original model's (same keys), so optimizers, ``.to()``,
    checkpoints and DistributedDataParallel work as with the original: wrap first, then
    ``DDP(wrapper)``, with each rank's batch the solution's batch size.

    Compiled: a solution solved with ``monet.optimize(..., compile=True)`` runs its forward and
    backward modules compiled by Inductor (`monet.compiled`), with the schedule's decisions kept.
    Otherwise the scheduled training step is a graph break for ``torch.compile``
    (``torch.compiler.disable``): ``torch.compile(wrapper)`` trains exactly as the wrapper does
    (eval mode is compiled as usual), and ``torch.compile`` of a larger module containing the
    wrapper compiles the code around it.  A model compiled before wrapping
    (``MONeTWrapper(torch.compile(model), ...)``) is refused.

    FSDP2 (``torch.distributed.fsdp.fully_shard``): shard the wrappers of the blocks, each with a
    schedule solved for one block, ``model.blocks[i] = fully_shard(MONeTWrapper(block, block_sol))``,
    then ``fully_shard(model)``.  FSDP2's hooks run around the wrapper: the block's parameters are
    all-gathered before its scheduled forward and again before its scheduled backward (with its
    recomputations), and its gradients reduce-scattered after.  A model that is or contains a
    ``fully_shard``-ed module, or holds DTensor parameters, is refused (`ShardedModelError`, also
    when it is sharded after wrapping: on the first training call): torch 2.13 keeps FSDP2's
    hooks out of Dynamo, so it cannot be captured as one graph.

    Mixed precision: a solution solved under autocast (``monet solve --autocast bf16``, or
    ``capture(model, x, autocast_dtype=torch.bfloat16)``) runs inside the caller's
    ``with torch.autocast(device_type, dtype=...)`` (backward inside or outside it, as with the
    plain model); its schedule is for the graph with autocast's casts and 16-bit activations.  A
    solution without autocast refuses to run inside one, and the other way round
    (`AutocastMismatchError`): the wrapper does not enter or leave autocast itself, so the output's
    dtype and what the caller's loss and GradScaler see are what the plain model gives.

    A loss traced with the model (``monet.optimize(..., loss_fn=F.cross_entropy, target=y)``) is
    recorded in the solution by name (``solution.meta.loss``): the wrapper puts the model in
    `monet.WithLoss` with that function again and is called as ``wrapper(x, target=y)``,
    returning the loss.

    Example::

        model = MONeTWrapper(net, "net.monet")        # solved by monet.optimize or monet solve
        loss = model(x, target=y)                      # or model(**batch).loss, as it was solved
        loss.backward(); opt.step(); opt.zero_grad()

    Args:
        model: the ``nn.Module`` the solution was made for (not a `WithLoss` of it: see above;
            a `WithLoss` given is used as it is).
        solution: path of a solution file, ``"zoo:NAME"`` for a prebuilt one, or a `Solution`.
        input_shape: optional: the shape of one sample without the batch dimension, e.g.
            (3, 224, 224), checked against the solution's at once (default: the solution's own;
            the first training call checks the inputs either way).
        compile: True: the schedule's forward and backward modules are compiled by Inductor
            (`monet.compiled`), for a solution solved with ``monet.optimize(..., compile=True)``;
            False: they run eagerly; None (default): as the solution was solved.

    Raises:
        monet.solution.SolutionFileError: the file is missing, corrupt or not a monet solution.
        monet.solution.SolutionMismatchError: (on construction) the input shape differs from the
            solution's, ``compile`` asks for the other graph than the solution's, or its recorded loss cannot be imported by name (the message says to pass
            ``WithLoss(model, loss_fn)``); (on the first call) the batch size, dtype or traced
            graph differs.
        monet.solution.AutocastMismatchError: (on a training call; also a RuntimeError) the
            autocast setting in force differs from the one the solution was solved for.
        TypeError: ``model`` is a ``torch.compile`` result (wrap the original model instead).
        monet.frontend.ShardedModelError: (also a TypeError) ``model`` is sharded with FSDP2's
            ``fully_shard`` or holds DTensor parameters; the message names the per-block way.
    """

    def __init__(self, model: nn.Module, solution, input_shape=None, compile: bool | None = None):
        """Wrap ``model`` (an ``nn.Module``) with ``solution`` (a `Solution`, a solution file's
        path, or ``"zoo:NAME"``).  ``input_shape``: optional, one sample's shape without the batch
        dimension, e.g. (3, 224, 224), checked against the solution's at once (a smaller one is
        accepted: it runs the same schedule); the first training call checks the inputs anyway.
        ``compile``: run the schedule's modules compiled by Inductor (a solution solved with
        ``compile=True``) or eagerly; None: as the solution was solved.
        A loss the solution traced is put back around the model (`monet.WithLoss`).  Nothing is
        traced here: the first training call does it.  The class docstring has the errors
        (`SolutionFileError`, `SolutionMismatchError`, ``TypeError``, `ShardedModelError`) and an
        example."""
        super().__init__()
        if compat.is_compiled_module(model):
            raise TypeError("MONeTWrapper needs the original model, not a torch.compile result: wrap "
                            "`model._orig_mod` (or the model before torch.compile); to train the schedule with "
                            "Inductor's kernels, solve it with monet.optimize(model, ..., compile=True)")
        refusal = fsdp_refusal(model)
        if refusal:
            raise ShardedModelError(refusal)
        if not isinstance(solution, Solution):
            solution = load_solution(solution)
        solved_compiled = bool(solution.meta.compiled)
        if compile is not None and bool(compile) != solved_compiled:
            raise SolutionMismatchError(
                f"the solution was solved for the {'compiled' if solved_compiled else 'eager'} step and "
                f"compile={compile!r} asks for the {'compiled' if compile else 'eager'} one, whose costs and memory "
                f"differ (Inductor's fused kernels): pass compile={solved_compiled}, or solve again with "
                f"monet.optimize(..., compile={bool(compile)})")
        self.compiled = solved_compiled
        self.solution = solution
        model = _with_recorded_loss(model, solution.meta)
        self.input_shape = solution.meta.input_shape if input_shape is None else tuple(int(s) for s in input_shape)
        if self.input_shape != solution.meta.input_shape and not _smaller(self.input_shape, solution.meta.input_shape):
            check_compatible(solution.meta, solution.meta.fingerprint, solution.meta.graph_summary,
                             batch_size=solution.meta.batch_size, input_shape=self.input_shape,
                             dtype=solution.meta.dtype)
        self.model = model
        self.__dict__["_exports"] = {}  # call_key -> export for the first trace (`offer_export`)
        self.__dict__["_traced"] = None  # not a submodule: its parameters are the model's
        self.__dict__["_checked"] = set()  # call keys whose inputs fit the solution (`_scheduled`)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return model_attribute(self, name)  # the model's own attributes (Trainer reads them)

    # state_dict and load_state_dict keep the original model's keys
    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def _check_graph(self, graph):
        meta = self.solution.meta
        shape = tuple(graph.input_shape) if graph.input_shape else (meta.batch_size, *meta.input_shape)
        made = (meta.batch_size, *meta.input_shape)
        if _smaller(shape, made) and graph.fingerprint != meta.fingerprint:
            # a smaller batch (an epoch's last) or a shorter sequence (a batch padded to its longest):
            # the same schedule runs if the graph is the same but for its sizes; every activation is
            # then smaller, and so is the schedule's peak
            if (same_structure(meta.graph_summary, graph.summary)
                    and (len(graph.fwd), len(graph.bwd)) == (meta.n_fwd, meta.n_bwd)):
                return
            raise SolutionMismatchError(
                f"the solution was made for inputs {made}; at {shape} this model's graph is not the same graph "
                f"with smaller sizes (other operators), so its schedule cannot run it: solve for {shape} too, "
                "or, where the sequence length changes from batch to batch, solve one schedule per length with "
                "monet.optimize(..., buckets=[...]) (monet.buckets) (for a smaller last batch: or drop it, "
                "drop_last=True)")
        check_compatible(meta, graph.fingerprint, graph.summary, batch_size=meta.batch_size,
                         input_shape=meta.input_shape, dtype=meta.dtype, nodes=(len(graph.fwd), len(graph.bwd)))

    def _check_inputs(self, inputs: ExampleInputs) -> None:
        """`SolutionMismatchError` unless the call fits the solution: the first input's dtype and
        rank, a batch no larger than the solution's, and a sample shape no larger in any dimension
        (a shorter sequence runs the same schedule, as a smaller batch does: checked on the graph)."""
        meta = self.solution.meta
        x = inputs.first
        batch = inputs.batch_size
        if 0 < batch < meta.batch_size:
            batch = meta.batch_size  # a smaller batch runs the same schedule (checked on the graph)
        elif batch > meta.batch_size:
            raise SolutionMismatchError(
                f"the solution was made for batch {meta.batch_size}, called with batch {inputs.batch_size}: "
                f"a larger batch needs more memory than the schedule was solved for; solve for batch "
                f"{inputs.batch_size}")
        sample = tuple(x.shape[1:])
        if _smaller(sample, meta.input_shape):
            sample = tuple(meta.input_shape)  # shorter: runs the same schedule (checked on the graph)
        elif len(sample) == len(meta.input_shape) and any(a > b for a, b in zip(sample, meta.input_shape)):
            raise SolutionMismatchError(
                f"the solution was made for inputs of shape {tuple(meta.input_shape)} per sample, called with "
                f"{tuple(x.shape[1:])}: larger inputs need more memory than the schedule was solved for; solve "
                f"for {tuple(x.shape[1:])} (for sequences of varying length: monet.optimize(..., buckets=[...]))")
        check_compatible(meta, meta.fingerprint, meta.graph_summary, batch_size=batch,
                         input_shape=sample, dtype=str(x.dtype))

    def _check_autocast(self, x: torch.Tensor):
        """The autocast setting in force for ``x``'s device; `AutocastMismatchError` unless it is
        the solution's.

        A solution for autocast is not run by entering autocast here: the output's dtype, the
        loss computed from it and a GradScaler belong to the caller's autocast region, exactly as
        with the plain model, so the caller opens it (and an fp32 solution is refused inside one).
        """
        running = mixed_precision.current(x.device.type)
        problem = mixed_precision.mismatch_message(getattr(self.solution.meta, "autocast", None), running)
        if problem:
            raise AutocastMismatchError(problem)
        return running

    def forward(self, *args, **kwargs):
        """The model's forward on ``args`` and ``kwargs``, as the model is called (a batch of at
        most the solution's batch size; a smaller one, an epoch's last, runs the same schedule),
        and with ``target=`` where the solution traced a loss.  Returns what the model returns
        (its loss where a loss was traced): in training mode with gradients enabled from the
        scheduled graphs, whose backward recomputes what the schedule dropped; otherwise from the
        model itself."""
        if not (self.training and torch.is_grad_enabled()):
            return self.model(*args, **kwargs)
        return self._scheduled(*args, **kwargs)

    # torch.compile stops here (a graph break) and runs the scheduled step eagerly: tracing into it
    # would trace AOTAutograd inside Dynamo (which fails) or let the compiler re-partition the
    # backward and drop the schedule's choices.  The code around the wrapper is still compiled.
    #
    # The checks of the inputs against the solution (`_check_inputs`, `_check_autocast`) run once per
    # call key (`call_key`: every tensor's shape, dtype and device, the arguments' structure and the
    # autocast setting, on which they depend), not on every call: a new shape, dtype or autocast
    # setting is a new key and is checked.
    @torch.compiler.disable(reason="MONeTWrapper runs its own scheduled forward/backward graphs")
    def _scheduled(self, *args, **kwargs):
        inputs = _call_inputs(self, args, kwargs)
        autocast = mixed_precision.current(inputs.first.device.type)
        key = call_key(inputs, autocast)
        checked = self.__dict__["_checked"]
        if key not in checked:
            self._check_inputs(inputs)
            self._check_autocast(inputs.first)
            if len(checked) >= MAX_CHECKED:
                checked.clear()
            checked.add(key)
        if self._traced is None:
            schedule: Schedule = self.solution.schedule
            self.__dict__["_traced"] = ScheduledModule(self.model, lambda g: schedule, check=self._check_graph,
                                                       autocast=autocast, exported=self.__dict__["_exports"],
                                                       transform=_graph_rewrite(self.solution.meta),
                                                       compiled=self.compiled,
                                                       pinned=self.compiled and self.solution.meta.compile_pinned)
            self.__dict__["_exports"] = {}
        return self._traced.run(key, inputs, autocast)

    def offer_export(self, graph, source: nn.Module | None = None) -> None:
        """Let the first training call trace the Dynamo export ``graph`` was captured from
        (``graph.exported``) instead of exporting the model again, if its call key comes: the
        export of ``source`` (default: this wrapper's model itself) rebound to this wrapper's
        model (`monet.frontend.rebind`).  Nothing happens for a graph without one.  `monet.optimize`
        and the CPU timings do this; at 96 layers an export takes about a minute."""
        if getattr(graph, "exported", None) is None:
            return
        key, gm = graph.exported
        if source is not None and source is not self.model:
            gm = rebind(gm, source, self.model)
        self.__dict__["_exports"][key] = gm

    @property
    def scheduled(self) -> ScheduledModule | None:
        """The `ScheduledModule` that runs the training calls (its ``monet_compiled`` holds the last
        trace's ``graph``, ``schedule``, ``fw`` and ``bw``; its ``traces`` the traces kept), or None
        before the first training call and after a move to another device or dtype."""
        return self._traced

    def _apply(self, fn, *args, **kwargs):
        self.__dict__["_traced"] = None  # a new device or dtype: trace again on the next call
        self.__dict__["_checked"] = set()
        self.__dict__["_exports"] = {}
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        m = self.solution.meta
        return (f"solution for {m.model or 'model'} batch {m.batch_size}, budget "
                f"{m.budget_bytes / 2**30:.2f} GiB, predicted peak {m.predicted_peak_bytes / 2**30:.2f} GiB")


__all__ = ["MONeTWrapper", "ScheduledModule", "ShardedModelError", "SolutionMismatchError", "AutocastMismatchError", "scheduled_module"]
