"""The trace file's format constants and errors, shared by the recording (`monet.profiling.trace`),
the graph serialisation (`monet.profiling.graph_json`) and the comparison
(`monet.profiling.trace_compare`)."""

FORMAT = "monet-trace"
VERSION = 1
SCOPE = "monet::"  # record_function / allocator metadata prefix of a node's row
PEAK_TOLERANCE = 0.02  # docs/design.md, "What must stay true": predicted peak within 2 % of measured
ENV_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
            "TORCH_CUBLASLT_UNIFIED_WORKSPACE", "TORCH_CUDNN_V8_API_DISABLED")
MEASURED = ["gap_peak_bytes", "before_bytes", "peak_bytes", "after_bytes"]
SIMULATED = ["sim_peak_bytes", "sim_after_bytes", "sim_outputs_bytes", "sim_workspace_bytes"]


class TraceFormatError(ValueError):
    """A file that is not a monet trace, or of a newer format version; the message names the file."""


class TraceMismatchError(ValueError):
    """A trace whose model, rebuilt here, is not the graph it recorded (another fingerprint)."""
