"""The options of `monet.optimize` beyond the model, its inputs, the budget, the loss and the time
limit: what the schedule is solved for, where the costs come from, the solver, and what the training
around the step holds.

    monet.optimize(model, x, budget="50%", options=Options(mode="full", cost="analytic"))
    monet.optimize(model, x, budget="50%", mode="full", cost="analytic")   # the same
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from monet.solver import DEFAULT_GAP

#: the fields `monet.plan.prepare` takes (the capture and the costs), and `Plan.solve` takes
CAPTURE_AND_COSTS = ("cost", "device", "gpu_spec", "autocast_dtype", "cache_dir", "lm_loss", "compile")
SOLVING = ("mode", "optimizer", "solver", "gap", "if_infeasible", "accumulate_grads", "reserved_bytes",
           "offload_bandwidth", "calibrate")


@dataclass(frozen=True)
class Options:
    """`monet.optimize`'s options, each with the default ``optimize`` uses.

    Attributes:
        mode: ``"normal"`` (recompute or keep) or a full-mode string (``"full"``,
            ``"inplace_conv_multiway_newnode"``...: operator implementations chosen too).
        accumulate_grads: gradient accumulation over micro-batches (``backward`` several times
            before ``step``): the parameters' gradients then stay allocated through every forward
            and backward pass after the first, so their bytes are taken out of the budget too.
        reserved_bytes: bytes held outside this graph during its forward and backward, taken out
            of the budget too.  For one block under FSDP2 (docs/guide.md, "FSDP2"): the whole model's
            sharded parameters, sharded gradients and sharded optimizer state (each 1/world_size
            of the unsharded bytes), the next block's all-gathered parameters when FSDP2 prefetches,
            and the activations the other blocks keep; the block's own all-gathered parameters and
            unsharded gradients are in its graph already.
        optimizer: ``"sgd"``, ``"sgd-momentum"``, ``"adam"`` or ``"adamw"``: count its state
            (0, 1, 2, 2 times the parameter bytes) in the budget.  None: not counted.
        cost: ``"hybrid"`` (measured workspace; measured times on the CPU, the roofline's on a
            GPU), ``"workspace"`` (measured workspace, the roofline's times: nothing timed),
            ``"analytic"`` or ``"profile"`` (`monet.profiling.sources`).
        device: the device the costs are for; default the inputs' device.
        gpu_spec: a roofline preset for analytic times on a GPU (``"h100"``, ``"p100"`` ...).
        autocast_dtype: solve for training under ``torch.autocast(device, autocast_dtype)``.
        solver, gap: the MILP solver ("CBC", "HIGHS", "SCIP") and the relative gap it may stop at.
        cache_dir: where measured costs are cached (default ``~/.cache/monet/profiles``).
        progress: a progress bar of the phases (capture, costs, solve, calibration) with their
            elapsed times, and the solver's lines above it, on stderr (`monet.progress`); False:
            nothing is printed.
        if_infeasible: ``"raise"`` (default): a budget below the smallest feasible one is an
            `InfeasibleBudgetError`; ``"smallest"``: solve at the smallest feasible budget found
            instead (logged), as ``monet demo`` does.
        offload_bandwidth: bytes per second (each direction) of host<->device copies: the ILP
            may then offload kept activations to host memory besides keeping or recomputing them
            (`monet.solver.offload`; mode ``"normal"`` only).  None (default, and on CPU): no
            offload.  `monet.profiling.bandwidth.measure_host_bandwidth` measures it on a GPU.
        lm_loss: for a language model trained with labels: ``"auto"`` (default) weighs the two
            below where the logits and their gradient are at least
            `monet.lm_choice.WEIGH_FRACTION` of plain PyTorch's peak, each solved in a share of
            ``time_limit``, and keeps the faster schedule under the budget (the log says which;
            elsewhere, and for any other model, it is None); None computes the head and the loss
            as the model does; ``"chunked"`` (or a number of token rows per chunk) replaces them
            by one op over chunks of tokens, so that the (B, T, V) logits and their gradient never
            exist (`monet.lm_loss`; Liger Kernel's chunk size by default): the model then returns
            no logits in training.
        buckets: sequence lengths (e.g. ``[128, 256, 512]``) for batches whose length changes
            from step to step (a collator padding to each batch's longest): one schedule per
            bucket, solved at that length for one budget in bytes (a percentage is of the longest
            bucket's plain peak), each in ``time_limit`` of its own; a batch of length T runs the
            schedule of the smallest bucket of at least T tokens, a longer one is refused
            (`monet.buckets`).  The example inputs are cut or padded to each length (dimension 1
            of every tensor of the first one's length).  Returns a `monet.buckets.BucketedWrapper`.
        calibrate: on the CPU with measured costs (``"hybrid"``, ``"profile"``), time the solved
            schedule against keeping everything and plain PyTorch and predict its overhead from
            its measured recomputation; in full mode, where it measures more than 3 % off, solve
            again with the recompute costs scaled to the measurement and keep the faster
            (`monet.profiling.calibration`), all within ``time_limit`` (where timing it would not
            fit, it is not timed and the solver gets the whole limit, said in the log).  False: the cost model's
            prediction, unmeasured.
        compile: solve for the step compiled by Inductor and return a wrapper that compiles it
            (`monet.compiled`; docs/guide.md, "torch.compile"): the costs are those of fused kernels
            (`monet.profiling.compiled_costs`), the mode must be ``"normal"``, and nothing is
            calibrated (the calibration times the eager step).  The first training step compiles.
    """
    mode: str = "normal"
    optimizer: str | None = None
    accumulate_grads: bool = False
    reserved_bytes: int = 0
    cost: str = "hybrid"
    device: str | None = None
    gpu_spec: str | None = None
    autocast_dtype: Any = None
    solver: str = "CBC"
    gap: float = DEFAULT_GAP
    cache_dir: Any = None
    progress: bool = True
    if_infeasible: str = "raise"
    offload_bandwidth: float | None = None
    calibrate: bool = True
    buckets: Any = None
    lm_loss: Any = "auto"
    compile: bool = False

    @classmethod
    def of(cls, options: "Options | None", overrides: dict[str, Any]) -> "Options":
        """``options`` (default ``Options()``) with the fields named in ``overrides`` replaced.

        Raises:
            TypeError: a name in ``overrides`` that is no field (the message lists the fields)."""
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise TypeError(f"optimize() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}: "
                            f"its options are {', '.join(fields)} (monet.options.Options)")
        if options is not None and not isinstance(options, cls):
            raise TypeError(f"options= takes a monet.options.Options, got {type(options).__name__}")
        return dataclasses.replace(options or cls(), **overrides)

    def capture_and_costs(self) -> dict[str, Any]:
        """The keyword arguments of `monet.plan.prepare` these options set."""
        return {k: getattr(self, k) for k in CAPTURE_AND_COSTS}

    def solving(self) -> dict[str, Any]:
        """The keyword arguments of `monet.plan.Plan.solve` these options set."""
        return {k: getattr(self, k) for k in SOLVING}


__all__ = ["Options", "CAPTURE_AND_COSTS", "SOLVING"]
