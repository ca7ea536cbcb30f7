"""A graph lowered for the device it runs on (`lower_for_device`): the kernels eager PyTorch runs
there, where AOTAutograd's decomposition runs others."""
from __future__ import annotations

import torch

from monet.graph import OpGraph
from monet.impls.batchnorm import use_cudnn_batch_norm
from monet.impls.dropout import lower_dropout
from monet.impls.registry import copy_joint, rebuild


def lower_for_device(graph: OpGraph) -> OpGraph:
    """``graph`` with the kernels eager PyTorch runs on its device, or faster ones that compute the
    same bits, where AOTAutograd's decomposition runs others: on CUDA with cuDNN enabled, cuDNN's
    BatchNorm (`monet.impls.batchnorm.use_cudnn_batch_norm`); on the CPU, dropout's forward and
    backward (fp32, bf16, fp16) without the mixed-dtype product (`monet.impls.dropout.lower_dropout`).

    What runs changes, not what is stored: node ids, the fingerprint, the summary and the memory each
    node holds stay (cuDNN's BatchNorm keeps the mean and inverse standard deviation the native kernel
    keeps, and a reserve space of 0 bytes for spatial BatchNorm; dropout's forward allocates its
    output and mask, its backward its result, and neither a temporary of the input's dtype), so a schedule solved for ``graph``, its simulation and its cost table (keyed by
    node id, named by ``graph``'s ops) hold for the result.  The executor (`monet.wrapper`) and the
    profiler (`monet.profiling.profiler`) run it.  ``graph`` itself is not modified; it is returned
    unchanged where nothing applies (on CUDA with cuDNN switched off, ``torch.backends.cudnn.enabled``).
    """
    if graph.joint is None or graph.device not in ("cpu", "cuda"):
        return graph
    if graph.device == "cpu":
        joint = copy_joint(graph.joint)
        return rebuild(graph, joint, graph.impls) if lower_dropout(joint.graph) else graph
    if not torch.backends.cudnn.enabled or (torch.cuda.is_available() and not torch.backends.cudnn.is_available()):
        return graph
    joint = copy_joint(graph.joint)
    if not use_cudnn_batch_norm(joint.graph):
        return graph
    return rebuild(graph, joint, graph.impls)
