"""The zoo's model names, how to build each model, and what input it takes.

A MODEL string, as the command line and ``get_model`` accept it, is one of

* a zoo name: a key of ``MODELS`` ("resnet50", "vgg16", "mobilenet_v2", "googlenet", "unet",
  "gpt2-small");
* MONeT's form ``"torchvision.models.<builder>(<keyword>=<literal>, ...)"``, for example
  ``"torchvision.models.resnet50()"``. It is parsed, never evaluated: only keyword arguments whose
  values are Python literals are allowed. torchvision is imported only for this form;
* ``"path/to/file.py:factory"``: the file is loaded as a module and ``factory()`` is called; it
  returns the ``nn.Module``, or ``(model, example_inputs)`` with example inputs as
  `monet.inputs.ExampleInputs.of` takes them (a tensor, a tuple of positional arguments or a dict
  of keyword arguments; the first tensor's first dimension is the batch).

``example_input`` makes a deterministic input batch for any of them; ``get_model_and_inputs``
builds a model with its example inputs for every form (an input spec, `monet.inputs.SPEC_FORMAT`,
gives inputs of any dtypes and names).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from .googlenet import googlenet
from .gpt2 import gpt2_small
from .mobilenet import mobilenet_v2
from .resnet import resnet50
from .unet import unet
from .vgg import vgg16

__all__ = ["ModelSpec", "MODELS", "get_model", "get_model_and_inputs", "example_input"]


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry.

    Attributes:
        name: the zoo name.
        factory: builds the model; keyword arguments are passed through (see each factory for the
            scaling arguments that build small variants).
        input_shape: shape of one sample, without the batch dimension.
        input_kind: "image" (float values from a standard normal) or "tokens" (integer ids).
        num_params: parameters of the default model (tied weights counted once).
        vocab_size: for "tokens", ids are drawn from ``[0, vocab_size)``.
        description: one line for listings.
    """

    name: str
    factory: Callable[..., nn.Module]
    input_shape: tuple[int, ...]
    input_kind: Literal["image", "tokens"]
    num_params: int
    vocab_size: int | None = None
    description: str = ""


_IMAGENET = (3, 224, 224)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet50", resnet50, _IMAGENET, "image", 25_557_032,
                  description="ResNet-50, torchvision layout"),
        ModelSpec("vgg16", vgg16, _IMAGENET, "image", 138_357_544,
                  description="VGG-16 without BatchNorm, torchvision layout"),
        ModelSpec("mobilenet_v2", mobilenet_v2, _IMAGENET, "image", 3_504_872,
                  description="MobileNetV2, torchvision layout"),
        ModelSpec("googlenet", googlenet, _IMAGENET, "image", 6_624_904,
                  description="GoogLeNet, torchvision layout without auxiliary heads"),
        # MONeT solved its UNet at 3x416x608 (utsaslab/MONeT, monet/cvxpy_solver.py).
        ModelSpec("unet", unet, (3, 416, 608), "image", 31_037_698,
                  description="U-Net (milesial, transposed-conv upsampling), 2 classes"),
        ModelSpec("gpt2-small", gpt2_small, (1024,), "tokens", 124_439_808, vocab_size=50257,
                  description="GPT-2 small, 1024 tokens, tied LM head"),
    )
}

_TORCHVISION_FORM = re.compile(r"^\s*torchvision\.models\.([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.DOTALL)


def _zoo_names() -> str:
    return ", ".join(MODELS)


def _parse_torchvision_kwargs(arguments: str, text: str) -> dict[str, Any]:
    """Read ``k=literal, ...`` without evaluating anything; reject every other argument form."""
    try:
        call = ast.parse(f"f({arguments})", mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"cannot parse the arguments of {text!r}: {exc.msg}") from None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        raise ValueError(f"{text!r} is not a single call 'torchvision.models.<builder>(...)'")
    if call.args:
        raise ValueError(f"{text!r}: torchvision builders take keyword arguments only")
    kwargs: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ValueError(f"{text!r}: '**' arguments are not allowed")
        try:
            kwargs[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            raise ValueError(
                f"{text!r}: the value of {keyword.arg!r} must be a literal (number, string, "
                "True/False/None, tuple, list or dict of literals)"
            ) from None
    return kwargs


def _torchvision_model(builder: str, kwargs: dict[str, Any]) -> nn.Module:
    """Build ``torchvision.models.<builder>(**kwargs)``, importing torchvision only now."""
    if builder in MODELS:
        hint = f"use the zoo name {builder!r}"
    else:
        hint = f"use a zoo name ({_zoo_names()}) or 'path/to/file.py:factory'"
    try:
        torchvision = importlib.import_module("torchvision")
    except Exception as exc:  # a broken install raises more than ImportError
        raise ImportError(
            f"torchvision is not importable here ({type(exc).__name__}: {exc}); {hint}"
        ) from exc
    factory = getattr(getattr(torchvision, "models", None), builder, None)
    if not callable(factory):
        raise ValueError(f"torchvision.models has no builder {builder!r}; {hint}")
    return factory(**kwargs)


def _file_factory(path_text: str, factory_name: str, kwargs: dict[str, Any]):
    """Load ``path_text`` as a module and return what its ``factory_name(**kwargs)`` returns."""
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    if not factory_name.isidentifier():
        raise ValueError(f"{factory_name!r} in '{path_text}:{factory_name}' is not a Python name")
    module_name = f"_monet_user_model_{abs(hash(str(path))):x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # lets dataclasses and pickling in the file find it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ValueError(f"{path} defines no callable {factory_name!r}")
    return factory(**kwargs)


def _split_factory_result(result, where: str):
    """``(model, example_inputs or None)`` from what a file factory returned.

    Raises:
        TypeError: neither an ``nn.Module`` nor a pair ``(nn.Module, example inputs)``.
    """
    if isinstance(result, nn.Module):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        from monet.inputs import ExampleInputs

        try:
            return result[0], ExampleInputs.of(result[1])
        except TypeError as e:
            raise TypeError(f"{where} returned (model, example_inputs) with unusable example inputs: {e}") from None
    raise TypeError(f"{where} returned {type(result).__name__}, not a torch.nn.Module or a pair "
                    "(model, example_inputs)")


def _file_model(path_text: str, factory_name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``factory_name(**kwargs)`` of the file ``path_text``, which must return an ``nn.Module``."""
    where = f"{path_text}:{factory_name}()"
    model, inputs = _split_factory_result(_file_factory(path_text, factory_name, kwargs), where)
    if inputs is not None:
        raise TypeError(f"{where} returned (model, example_inputs): use get_model_and_inputs")
    return model


def get_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the model a MODEL string names (see the module docstring for the three forms).

    Keyword arguments go to the factory: for zoo names they select small variants, for example
    ``get_model("gpt2-small", n_layer=2, n_embd=64, n_head=2)``.

    Raises:
        ValueError: an unknown name (the message lists the zoo) or a malformed string.
        ImportError: the torchvision form where torchvision cannot be imported.
        FileNotFoundError: the file form with a missing file.
    """
    text = name.strip()
    if text in MODELS:
        return MODELS[text].factory(**kwargs)
    match = _TORCHVISION_FORM.match(text)
    if match:
        builder, arguments = match.groups()
        parsed = _parse_torchvision_kwargs(arguments, text)
        return _torchvision_model(builder, {**parsed, **kwargs})
    path_text, sep, factory_name = text.rpartition(":")
    if sep and path_text.endswith(".py"):
        return _file_model(path_text, factory_name, kwargs)
    raise ValueError(
        f"unknown model {name!r}: expected a zoo name ({_zoo_names()}), "
        "'torchvision.models.<builder>()' or 'path/to/file.py:factory'"
    )


def get_model_and_inputs(name: str, batch_size: int | None = None, input_shape: tuple[int, ...] | None = None,
                         inputs_spec: str | None = None, *, dtype: torch.dtype | None = None, seed: int = 0,
                         device: torch.device | str | None = None, **kwargs: Any):
    """``(model, ExampleInputs)`` for any MODEL string (see the module docstring).

    The inputs come from, in this order:

    * ``inputs_spec`` (`monet.inputs.SPEC_FORMAT`, e.g. ``"input_ids=16:int64:50257"``), any MODEL;
    * a file factory that returns ``(model, example_inputs)``: its inputs, as they are. Their
      batch is the factory's: ``batch_size``, when given, must equal it (the inputs are never
      re-batched: repeating or slicing a batch could make it inconsistent, e.g. labels or masks
      that belong to other rows); ``input_shape`` and ``dtype``, when given, must be those of the
      first tensor, and ``inputs_spec`` must not be given;
    * otherwise one tensor from `example_input` (``input_shape`` defaults to a zoo model's; other
      models need it or ``inputs_spec``), of shape ``(batch_size, *input_shape)``.

    ``batch_size`` (>= 1) is required except for a factory that returns its own inputs.  Keyword
    arguments go to the factory, as in `get_model`.  The model is built as it comes; call
    ``torch.manual_seed`` first for the same weights on every call.

    Raises:
        ValueError: an unknown or malformed MODEL string, a malformed ``inputs_spec``, a missing or
            non-positive batch size, a missing input shape, a batch size or input option that
            contradicts a factory's own example inputs.
        TypeError: a file factory that returns something else than a module or (module, inputs).
        ImportError, FileNotFoundError: as `get_model`.
    """
    from monet.inputs import inputs_from_spec

    text = name.strip()
    path_text, sep, factory_name = text.rpartition(":")
    if text not in MODELS and not _TORCHVISION_FORM.match(text) and sep and path_text.endswith(".py"):
        where = f"{path_text}:{factory_name}()"
        model, inputs = _split_factory_result(_file_factory(path_text, factory_name, kwargs), where)
    else:
        model, inputs = get_model(text, **kwargs), None
    if inputs is not None:
        first = inputs.first
        if inputs_spec is not None:
            raise ValueError(f"{where} returns its own example inputs ({inputs.describe()}): "
                             "do not give an input spec (--inputs) as well")
        if input_shape is not None and tuple(input_shape) != tuple(first.shape[1:]):
            raise ValueError(f"{where} returns example inputs whose first tensor has samples of shape "
                             f"{tuple(first.shape[1:])}, not {tuple(input_shape)} ({inputs.describe()}): "
                             "leave the input shape (--input-shape) out")
        if batch_size is not None and int(batch_size) != inputs.batch_size:
            raise ValueError(f"{where} returns example inputs of batch {inputs.batch_size} "
                             f"({inputs.describe()}), not {int(batch_size)}: leave the batch size "
                             f"(--batch-size) out, or make the factory build a batch of {int(batch_size)}")
        if dtype is not None and dtype != first.dtype:
            raise ValueError(f"{where} returns example inputs whose first tensor is "
                             f"{str(first.dtype).removeprefix('torch.')}, not {str(dtype).removeprefix('torch.')}")
        return model, (inputs if device is None else inputs.to(device))
    if batch_size is None:
        raise ValueError(f"{name!r} needs a batch size (batch_size, --batch-size): only a factory that "
                         "returns (model, example_inputs) fixes its own")
    if inputs_spec is None and input_shape is None and text not in MODELS:
        raise ValueError(f"{name!r} is not a zoo model and returns no example inputs: give one sample's shape "
                         "(input_shape, --input-shape 3,224,224) or an input spec (inputs_spec, --inputs "
                         "'input_ids=128:int64:50257')")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if inputs_spec is not None:
        return model, inputs_from_spec(inputs_spec, int(batch_size), seed=seed, device=device)
    x = example_input(text, int(batch_size), input_shape, dtype, seed=seed, device=device)
    from monet.inputs import ExampleInputs

    return model, ExampleInputs.of(x)


def example_input(
    name_or_model_spec: str | ModelSpec,
    batch_size: int,
    input_shape: tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
    *,
    vocab_size: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A deterministic input batch of shape ``(batch_size, *input_shape)``.

    For zoo models ``input_shape`` defaults to the entry's, and the entry's ``input_kind`` decides
    the values: "image" gives standard-normal floats (``dtype`` defaults to float32), "tokens" gives
    ids in ``[0, vocab_size)`` (``dtype`` defaults to torch.long and must be an integer type;
    ``vocab_size`` defaults to the entry's, pass a smaller one for a small variant). Any other MODEL
    string gets standard-normal floats and needs ``input_shape``. The same arguments give the same
    tensor on every call (a private generator seeded with ``seed``; the global RNG is untouched).
    """
    if isinstance(name_or_model_spec, ModelSpec):
        spec: ModelSpec | None = name_or_model_spec
    else:
        spec = MODELS.get(name_or_model_spec.strip())
    if input_shape is None:
        if spec is None:
            raise ValueError(f"{name_or_model_spec!r} is not a zoo model: pass input_shape")
        input_shape = spec.input_shape
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    shape = (batch_size, *input_shape)
    generator = torch.Generator().manual_seed(seed)
    if spec is not None and spec.input_kind == "tokens":
        dtype = torch.long if dtype is None else dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise ValueError(
                f"{spec.name} takes token ids: dtype must be an integer type, got {dtype}"
            )
        high = vocab_size if vocab_size is not None else spec.vocab_size
        tensor = torch.randint(0, high, shape, generator=generator, dtype=dtype)
    else:
        tensor = torch.randn(shape, generator=generator, dtype=dtype or torch.float32)
    return tensor if device is None else tensor.to(device)
