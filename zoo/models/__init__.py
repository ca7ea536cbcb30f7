"""Model definitions of the zoo, written for this project (no torchvision needed).

``MODELS`` maps each zoo name to a ``ModelSpec`` (factory, per-sample input shape and kind, parameter
count); ``get_model`` builds a model from a MODEL string; ``example_input`` makes a deterministic
input batch for it.
"""
from .googlenet import GoogLeNet, googlenet
from .gpt2 import GPT2, gpt2_small
from .mobilenet import MobileNetV2, mobilenet_v2
from .registry import MODELS, ModelSpec, example_input, get_model, get_model_and_inputs
from .resnet import ResNet, resnet50
from .unet import UNet, unet
from .vgg import VGG, vgg16

__all__ = [
    "MODELS", "ModelSpec", "get_model", "get_model_and_inputs", "example_input",
    "ResNet", "resnet50", "VGG", "vgg16", "MobileNetV2", "mobilenet_v2",
    "GoogLeNet", "googlenet", "UNet", "unet", "GPT2", "gpt2_small",
]
