"""Models and example inputs from a MODEL string, as the command line and the checks name them.

MODEL is a zoo name (``resnet50``, ``gpt2-small`` ...), MONeT's form
``"torchvision.models.resnet50()"`` or ``"path/to/file.py:factory"`` (`monet.zoo.models`
resolves all three).  `build` fixes the seed, so every call gives the same weights and inputs:
``monet solve`` and ``monet check`` rebuild the same model from a solution's record.
"""
from __future__ import annotations


def build(model_name: str, batch_size: int | None, input_shape: tuple[int, ...] | None = None,
          device: str = "cpu", dtype=None, inputs_spec: str | None = None, **model_kwargs):
    """(model, `monet.inputs.ExampleInputs`) on ``device``, from seed 0; ``model_kwargs`` go to the
    factory (a zoo model's scaling arguments: ``base_width=16``).

    The inputs come from ``inputs_spec`` (the ``--inputs`` syntax, `monet.inputs.parse_inputs_spec`),
    or the factory's own example inputs (a factory returning ``(model, example_inputs)``), or one
    tensor of shape ``(batch_size, *input_shape)`` of ``dtype`` (`monet.zoo.models.get_model_and_inputs`).

    Raises:
        ValueError: a batch size below 1, or a model that cannot be built (unknown name, missing
            file or factory, an import error, inputs that do not fit), with the reason.
    """
    import torch

    from monet.zoo.models import get_model_and_inputs

    if batch_size is not None and batch_size < 1:
        raise ValueError(f"the batch size (--batch-size) must be positive, got {batch_size}")
    torch.manual_seed(0)
    try:
        model, inputs = get_model_and_inputs(model_name, batch_size, input_shape, inputs_spec, dtype=dtype,
                                             **model_kwargs)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        raise ValueError(f"cannot build model {model_name!r}: {e}") from None
    return model.to(device), inputs.to(device)


def input_info(inputs, inputs_spec: str | None) -> dict:
    """What a solution records of its inputs (`monet.solution.SolutionMeta`): ``batch_size``, the
    first tensor's ``input_shape`` (one sample, without the batch) and ``dtype`` name, and the
    ``inputs_spec`` it was built from (None: one tensor, or the factory's own inputs)."""
    first = inputs.first
    return dict(batch_size=inputs.batch_size, input_shape=tuple(first.shape[1:]),
                dtype=str(first.dtype).removeprefix("torch."), inputs_spec=inputs_spec)
