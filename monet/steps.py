"""The typed steps of a `Schedule`: its one reading, in execution order.

A `monet.solution.Schedule` is what a solution file stores (kept forward nodes, per-stage
recomputations and releases, offloads).  `steps` reads it as a list of typed steps, as Checkmate
(Jain et al., MLSys 2020) keeps a schedule: its code's ``ScheduledResult`` is a list of compute,
allocate and deallocate operations.  So the executor (`monet.executor`), the ILP-side accounting
(`monet.matrices.matrices_from_schedule`) and the summaries all read the same sequence instead of
walking the stages each in its own way.

Stages are numbered as the rows of MONeT's S and R matrices (Shah et al., ICLR 2021, Sec. 4, with
the forward pass apart): backward stage ``t`` (0-based) is row ``t``; the forward pass, MONeT's
stage 0, has stage `FORWARD` (-1).  The kinds:

=============  ==========  ==================================================================
kind           stage       ``node`` (and ``value``)
=============  ==========  ==================================================================
`COMPUTE`      FORWARD     forward node computed by the forward pass (every node, in order)
`OFFLOAD`      FORWARD     forward node after which the device copy of ``value`` is freed
                           (its host copy is saved instead; `monet.offload`)
`KEEP`         FORWARD, t  forward node whose outputs are kept from the forward pass, or that
                           stage t recomputed and keeps into stage t + 1; a kept node stays
                           kept until its `FREE` step
`PREFETCH`     t           backward node of stage t, at whose start ``value`` is copied back
`RECOMPUTE`    t           forward node recomputed in stage t, before its backward node
`BACKWARD`     t           backward node run in stage t
`FREE`         t           forward node whose outputs are released after stage t's backward node
=============  ==========  ==================================================================

Within a stage the order is: prefetches, recomputations (in the schedule's order), the backward
node, frees, keeps into the next stage.  The forward pass is its compute steps with each offload
after the compute step of its release node (at the end when that is past the last node), then its
keeps.
"""
from __future__ import annotations

from dataclasses import dataclass

FORWARD = -1
COMPUTE = "compute"
OFFLOAD = "offload"
KEEP = "keep"
PREFETCH = "prefetch"
RECOMPUTE = "recompute"
BACKWARD = "backward"
FREE = "free"
KINDS = (COMPUTE, OFFLOAD, KEEP, PREFETCH, RECOMPUTE, BACKWARD, FREE)


@dataclass(frozen=True)
class Step:
    """One step of a schedule.

    Attributes:
        kind: one of `KINDS` (see the module's table).
        stage: `FORWARD` (-1) for the forward pass, else the backward stage t (row t of S and R).
        node: the forward node id (for a backward step and a prefetch, the backward node id).
        value: for an offload or a prefetch, the joint graph's FX name of the value; else None.
    """
    kind: str
    stage: int
    node: int
    value: str | None = None


def steps(schedule, n_fwd: int | None = None) -> list[Step]:
    """The steps of ``schedule`` (a `monet.solution.Schedule`) in execution order.

    Args:
        schedule: the schedule to read.
        n_fwd: the graph's number of forward nodes, for the forward pass's `COMPUTE` steps; None
            leaves them out (a `Schedule` does not record it; readers of the backward stages and
            of the kept values do not need them).

    `KEEP` steps for stage t are emitted only when a stage t + 1 follows (after the last stage
    nothing is kept), and only for the nodes that become kept there: what a stage keeps is what
    the forward pass and the stages before it kept, less what they freed.  (One keep step per kept
    node and stage made a 24-layer GPT-2's schedule 800,000 steps long, and reading them took
    longer than solving it.)
    """
    out: list[Step] = []
    n = 0 if n_fwd is None else int(n_fwd)
    offloads = list(schedule.offload)
    for i in range(n):
        out.append(Step(COMPUTE, FORWARD, i))
        out += [Step(OFFLOAD, FORWARD, r, v) for v, r, _ in offloads if r == i]
    out += [Step(OFFLOAD, FORWARD, r, v) for v, r, _ in offloads if r >= n]
    out += [Step(KEEP, FORWARD, i) for i in schedule.saved]
    kept = set(schedule.saved)
    last = len(schedule.stages) - 1
    for t, stage in enumerate(schedule.stages):
        out += [Step(PREFETCH, t, stage.backward, v) for v, _, p in offloads if p == t]
        out += [Step(RECOMPUTE, t, i) for i in stage.recompute]
        out.append(Step(BACKWARD, t, stage.backward))
        out += [Step(FREE, t, i) for i in stage.release]
        new = set(stage.recompute) - set(stage.release) - kept
        kept = (kept | new) - set(stage.release)
        if t < last:
            out += [Step(KEEP, t, i) for i in sorted(new)]
    return out


__all__ = ["Step", "steps", "KINDS", "FORWARD", "COMPUTE", "OFFLOAD", "KEEP", "PREFETCH", "RECOMPUTE",
           "BACKWARD", "FREE"]
