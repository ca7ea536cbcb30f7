"""MobileNetV2 (Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", 2018).

Laid out as ``torchvision.models.mobilenet_v2()`` (3,504,872 parameters with 1000 classes): a 3x3/2
stem, seventeen inverted-residual blocks (1x1 expansion, 3x3 depthwise, 1x1 linear projection; a
residual connection where stride is 1 and the width is unchanged), a 1x1 convolution to 1280
channels, global average pooling and Dropout(0.2) + Linear. Convolutions are bias-free and followed
by BatchNorm; activations are ``nn.ReLU6(inplace=True)``.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["ConvBNReLU6", "InvertedResidual", "MobileNetV2", "mobilenet_v2"]

# (expansion factor t, output channels c, repeats n, stride of the first repeat s), from the paper.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count to the nearest multiple of ``divisor``, never losing more than 10 %."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


class ConvBNReLU6(nn.Sequential):
    """Bias-free convolution (padding keeps the size at stride 1), BatchNorm, in-place ReLU6."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
        groups: int = 1,
    ) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2,
                      groups=groups, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """Expand with a 1x1 convolution, filter depthwise with 3x3, project linearly with 1x1.

    Args:
        in_channels, out_channels: block input and output widths.
        stride: stride of the depthwise convolution (1 or 2).
        expand_ratio: hidden width is ``round(in_channels * expand_ratio)``; with 1 the expansion
            convolution is left out.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        hidden = int(round(in_channels * expand_ratio))
        self.use_residual = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(in_channels, hidden, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden, hidden, kernel_size=3, stride=stride, groups=hidden),
            nn.Conv2d(hidden, out_channels, kernel_size=1, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_residual:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 for images (N, 3, H, W); returns logits (N, num_classes).

    Any H, W of at least 32 works (the network downsamples by 32, then pools globally).

    Args:
        num_classes: size of the output.
        width_mult: multiplies every width (rounded to multiples of 8); 1.0 is the real model.
        dropout: dropout probability before the last linear layer.
        inverted_residual_setting: rows (t, c, n, s) as in ``INVERTED_RESIDUAL_SETTING``, the
            paper's table; fewer rows give cheap test models.
    """

    def __init__(
        self,
        num_classes: int = 1000,
        width_mult: float = 1.0,
        dropout: float = 0.2,
        inverted_residual_setting: Sequence[tuple[int, int, int, int]] = INVERTED_RESIDUAL_SETTING,
    ) -> None:
        super().__init__()
        channels = make_divisible(32 * width_mult)
        self.last_channel = make_divisible(1280 * max(1.0, width_mult))
        layers: list[nn.Module] = [ConvBNReLU6(3, channels, kernel_size=3, stride=2)]
        for t, c, n, s in inverted_residual_setting:
            out_channels = make_divisible(c * width_mult)
            for repeat in range(n):
                layers.append(InvertedResidual(channels, out_channels, s if repeat == 0 else 1, t))
                channels = out_channels
        layers.append(ConvBNReLU6(channels, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes)
        )
        self._init_weights()

    def _init_weights(self) -> None:
        """He (fan-out) convolutions, unit/zero BatchNorm, N(0, 0.01) linear, zero biases."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(
    num_classes: int = 1000,
    *,
    width_mult: float = 1.0,
    dropout: float = 0.2,
    inverted_residual_setting: Sequence[tuple[int, int, int, int]] = INVERTED_RESIDUAL_SETTING,
) -> MobileNetV2:
    """MobileNetV2 as in torchvision: 3,504,872 parameters with the defaults.

    ``width_mult`` below 1 and a shorter ``inverted_residual_setting`` give cheap test models.
    Default input: (3, 224, 224).
    """
    return MobileNetV2(num_classes, width_mult, dropout, inverted_residual_setting)
