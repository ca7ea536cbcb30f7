"""VGG-16 without BatchNorm (Simonyan and Zisserman, "Very Deep Convolutional Networks", 2014).

Configuration "D" of the paper, laid out as ``torchvision.models.vgg16()``: 13 3x3 convolutions with
bias, each followed by ``nn.ReLU(inplace=True)``, five 2x2 max-pools, an ``AdaptiveAvgPool2d((7, 7))``
and a classifier Linear(25088, 4096) - ReLU - Dropout - Linear(4096, 4096) - ReLU - Dropout -
Linear(4096, num_classes). 138,357,544 parameters with 1000 classes.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["VGG", "VGG16_CONFIG", "vgg16"]

# Output channels of each 3x3 convolution; "M" is a 2x2 max-pool with stride 2.
VGG16_CONFIG: tuple[int | str, ...] = (
    64, 64, "M",
    128, 128, "M",
    256, 256, 256, "M",
    512, 512, 512, "M",
    512, 512, 512, "M",
)


class VGG(nn.Module):
    """A plain VGG network for images (N, 3, H, W); returns logits (N, num_classes).

    Any H, W of at least 32 works: the adaptive pool brings the last feature map to 7x7.

    Args:
        config: convolution widths and "M" for max-pools, as in ``VGG16_CONFIG``.
        num_classes: size of the output.
        hidden: width of the two hidden fully connected layers.
        dropout: dropout probability in the classifier.
    """

    def __init__(
        self,
        config: tuple[int | str, ...] = VGG16_CONFIG,
        num_classes: int = 1000,
        hidden: int = 4096,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers.append(nn.Conv2d(channels, int(item), kernel_size=3, padding=1))
                layers.append(nn.ReLU(inplace=True))
                channels = int(item)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, num_classes),
        )
        self._init_weights()

    def _init_weights(self) -> None:
        """He initialisation for convolutions, N(0, 0.01) for linear layers, zero biases."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def vgg16(
    num_classes: int = 1000, *, width: int = 64, hidden: int = 4096, dropout: float = 0.5
) -> VGG:
    """VGG-16 (no BatchNorm) as in torchvision: 138,357,544 parameters with the defaults.

    ``width`` scales every convolution (the first stage has ``width`` channels, 64 in the real
    model) and ``hidden`` sets the classifier width, for cheap test models. Default input:
    (3, 224, 224).
    """
    config = tuple(item if item == "M" else int(item) * width // 64 for item in VGG16_CONFIG)
    return VGG(config, num_classes, hidden, dropout)
