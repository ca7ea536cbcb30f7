"""Real models from torchvision, timm and Hugging Face transformers, in tiny configurations.

Each entry builds ``(model, example_inputs, loss)``: the model (seed 0, training mode), one batch as
the model is called (a tensor or keyword arguments), and how its loss is made: ``"output"`` (a
transformers model given ``labels`` computes it) or a classification target for
``F.cross_entropy``.  Packages that do not import are skipped by the tests with the reason.

torchvision's C extension does not load beside the CPU build of torch that CI installs
(``operator torchvision::nms does not exist``): its Python models need only its two detection ops
declared, which `declare_torchvision_ops` does with ``torch.library`` before the first import.
"""
from __future__ import annotations

import importlib
import importlib.util

import torch

_LIB = None


def declare_torchvision_ops() -> None:
    """Declare ``torchvision::nms`` and ``torchvision::qnms`` (schemas only) when torchvision's C
    extension cannot register them, so that ``import torchvision`` works; calling either raises.

    The extension is loaded first where it can be (a torchvision built for this torch, e.g. the
    CUDA builds of 2.11 and 2.14): declaring the ops there too made its registration abort the
    process."""
    global _LIB
    if _LIB is not None:
        return
    try:
        torch.ops.torchvision.nms.default  # registered by a working C extension
        return
    except (AttributeError, RuntimeError):
        pass
    spec = importlib.util.find_spec("torchvision")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(__import__("pathlib").Path(folder).glob("_C*.so")):
            try:
                torch.ops.load_library(str(lib))
                torch.ops.torchvision.nms.default
                return
            except (OSError, RuntimeError, AttributeError):
                pass
    _LIB = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - test-only declaration
    _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def missing(package: str) -> str | None:
    """None when ``package`` imports, else the reason to skip: it is not installed.

    Raises:
        ImportError: ``package`` is installed and does not import (a broken install fails the
            tests that need it instead of skipping them).
    """
    declare_torchvision_ops()
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install -e '.[test]' installs it)"
    try:
        importlib.import_module(package)
    except Exception as e:  # noqa: BLE001 - whatever stops the import is the error
        raise ImportError(f"{package} is installed and does not import: {type(e).__name__}: {e}") from e
    return None


B = 2  # the tests' batch
CLASSES = 10


def _image(b: int, size: int = 64):
    return torch.randn(b, 3, size, size), torch.randint(0, CLASSES, (b,))


def _tv(builder, **kw):
    import torchvision.models as tvm

    return getattr(tvm, builder)(num_classes=CLASSES, **kw)


def _timm(name, **kw):
    import timm

    return timm.create_model(name, pretrained=False, num_classes=CLASSES, **kw)


def _tokens(b: int, vocab=128, seq=16):
    return torch.randint(0, vocab, (b, seq))


def _gpt2(b):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    ids = _tokens(b)
    return model, dict(input_ids=ids, labels=ids, use_cache=False)


def _llama(b):
    from transformers import LlamaConfig, LlamaForCausalLM

    # grouped-query attention (4 query heads, 2 key/value heads) and rotary embeddings
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                         pad_token_id=0))
    ids = _tokens(b)
    return model, dict(input_ids=ids, labels=ids, use_cache=False)


def _bert(b):
    from transformers import BertConfig, BertForMaskedLM

    # masked language model: the decoder's weight is tied to the word embeddings
    model = BertForMaskedLM(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=64, pad_token_id=0))
    ids = _tokens(b)
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)


def _vit(b):
    from transformers import ViTConfig, ViTForImageClassification

    model = ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=64, num_labels=CLASSES))
    x, y = _image(b, 32)
    return model, dict(pixel_values=x, labels=y)


def _clip(b):
    from transformers import CLIPConfig, CLIPModel

    # two towers (text and vision, 2 layers each) and the contrastive loss between them
    text = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=32)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))
    return model, dict(input_ids=_tokens(b), pixel_values=_image(b, 32)[0], return_loss=True)


def _qwen2(b):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         bos_token_id=0, eos_token_id=0, pad_token_id=0))
    ids = _tokens(b)
    return model, dict(input_ids=ids, labels=ids, use_cache=False)


# name -> (package, builder(batch) returning (model, inputs) with the loss in the output, or
#          (model, (x, y)) for a classifier trained with cross-entropy)
MODELS = {
    "torchvision/resnet18": ("torchvision", lambda b: (_tv("resnet18"), _image(b))),
    "torchvision/mobilenet_v3_small": ("torchvision", lambda b: (_tv("mobilenet_v3_small"), _image(b))),
    "torchvision/efficientnet_b0": ("torchvision", lambda b: (_tv("efficientnet_b0"), _image(b))),
    "torchvision/shufflenet_v2_x0_5": ("torchvision", lambda b: (_tv("shufflenet_v2_x0_5"), _image(b))),
    "timm/vit_tiny_patch16_224": ("timm", lambda b: (_timm("vit_tiny_patch16_224", img_size=32, patch_size=8), _image(b, 32))),
    "timm/convnext_atto": ("timm", lambda b: (_timm("convnext_atto"), _image(b))),
    "timm/resnet10t": ("timm", lambda b: (_timm("resnet10t"), _image(b))),
    "transformers/gpt2": ("transformers", _gpt2),
    "transformers/llama": ("transformers", _llama),
    "transformers/bert-mlm": ("transformers", _bert),
    "transformers/vit": ("transformers", _vit),
    "transformers/qwen2": ("transformers", _qwen2),
    "transformers/clip": ("transformers", _clip),
}


# Heavier models, run with MONET_REACH=all (Swin-T: 28 M parameters, about 8 minutes on 2 cores):
# its relative-position index is a constant lifted into the graph (a get_attr node).
EXTRA = {
    "torchvision/swin_t": ("torchvision", lambda b: (_tv("swin_t"), _image(b))),
}


def _wav2vec2(b):
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    # speech recognition with the CTC loss; Dynamo breaks its graph 7 times (the feature encoder
    # sets requires_grad, the labels are checked by value, the CTC loss reads lengths)
    config = Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=6, num_attention_heads=2,
                            intermediate_size=256, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                            num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, hidden_dropout=0.0,
                            attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0,
                            mask_time_prob=0.0, ctc_loss_reduction="mean", pad_token_id=0)
    g = torch.Generator().manual_seed(2)
    return Wav2Vec2ForCTC(config), dict(input_values=torch.randn(b, 16000, generator=g),
                                        labels=torch.randint(1, 32, (b, 12), generator=g))


#: models Dynamo captures only in pieces (graph breaks): `monet.pieces`, tests/test_pieces.py
IN_PIECES = {
    "transformers/wav2vec2-ctc": ("transformers", _wav2vec2),
}


# The benchmark table's batch per model (`benchmarks/reach_table.py`): large enough that activations,
# not parameters and gradients, make most of plain PyTorch's peak, so that "50 % of the plain peak" is
# a budget a schedule can meet, and small enough for an iteration of about a second on 2 CPU cores.
TABLE_BATCH = {
    "torchvision/resnet18": 64, "torchvision/mobilenet_v3_small": 32, "torchvision/efficientnet_b0": 16,
    "torchvision/shufflenet_v2_x0_5": 32, "timm/vit_tiny_patch16_224": 32, "timm/convnext_atto": 16,
    "timm/resnet10t": 32, "transformers/gpt2": 16, "transformers/llama": 16, "transformers/bert-mlm": 16,
    "transformers/vit": 32, "transformers/qwen2": 16, "transformers/clip": 16, "torchvision/swin_t": 4,
}


def build(name: str, batch: int = B):
    """``(model, inputs, target)`` for ``batch`` examples: target None when the model's output holds its
    loss.  Raises KeyError for a name of neither `MODELS` nor `EXTRA`."""
    declare_torchvision_ops()
    torch.manual_seed(0)
    model, batch = {**MODELS, **EXTRA, **IN_PIECES}[name][1](batch)
    model.train()
    if isinstance(batch, tuple):  # (image, class) for cross-entropy
        return model, batch[0], batch[1]
    return model, batch, None
