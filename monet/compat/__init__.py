"""Every use of PyTorch's private or version-dependent APIs, in one package.

monet builds on AOTAutograd's joint graph, its partitioner helpers and its runtime, on Dynamo's
export, on backend flags and on the profiler's raw allocator events.  None of these is a public,
stable API: each release moves some of them.  The rest of monet imports them from here only
(`tests/test_compat.py` checks that no other module touches ``torch._functorch``, ``torch._dynamo``,
``torch._inductor``, ``torch._guards``, ``torch._subclasses``, ``torch._C._dynamo``,
``torch._C._profiler``, ``functorch`` or ``torch.fx.graph._BoxedCodeGen``), so that a new release
is one package to read and fix: `monet.compat.graphs` (capture and the executor),
`monet.compat.inductor` (the compiled step) and `monet.compat.runtime` (numerics and measurement),
all of their entries importable from ``monet.compat``.  Each entry says which releases it was checked on and how they differ.

Admitted releases: torch 2.11 through 2.15 (`SUPPORTED`).  Checked on 2.11.0+cu130, 2.13.0+cpu,
2.14.1+cu130 and 2.15.0+cu132 (the entries below were read in each one's sources).  Out of that
range `check_version` warns once: the entries may then have moved."""
from monet.compat.graphs import *  # noqa: F401,F403
from monet.compat.graphs import __all__ as _graphs
from monet.compat.inductor import *  # noqa: F401,F403
from monet.compat.inductor import __all__ as _inductor
from monet.compat.runtime import *  # noqa: F401,F403
from monet.compat.runtime import __all__ as _runtime

__all__ = [*_graphs, *_inductor, *_runtime]
