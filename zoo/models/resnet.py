"""ResNet-50 (He et al., "Deep Residual Learning for Image Recognition", 2015).

The layout matches ``torchvision.models.resnet50()`` module for module and parameter for parameter
(25,557,032 parameters with 1000 classes), so a schedule made for one applies to the other:

* the stem is a 7x7/2 convolution, BatchNorm, ReLU and a 3x3/2 max-pool;
* four stages of bottleneck blocks, (3, 4, 6, 3) blocks with 64, 128, 256, 512 inner channels and
  four times as many output channels;
* the stride of a stage sits on the 3x3 convolution of its first block ("ResNet v1.5"), and a block
  whose shape changes gets a 1x1 convolution + BatchNorm projection on its shortcut;
* every convolution is bias-free and followed by BatchNorm; every ReLU is ``nn.ReLU(inplace=True)``;
* global average pooling and one fully connected layer.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Bottleneck", "ResNet", "resnet50"]


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride) -> 1x1 expand, plus a shortcut, then ReLU.

    Args:
        in_channels: channels entering the block.
        width: channels of the two inner convolutions.
        stride: stride of the 3x3 convolution (1 or 2).
        expansion: output channels are ``width * expansion``.
    """

    def __init__(self, in_channels: int, width: int, stride: int = 1, expansion: int = 4) -> None:
        super().__init__()
        out_channels = width * expansion
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        y += shortcut
        return self.relu(y)


class ResNet(nn.Module):
    """A bottleneck ResNet for images of shape (N, 3, H, W); returns logits (N, num_classes).

    Any H, W of at least 32 works (the network downsamples by 32, then pools globally).

    Args:
        layers: number of bottleneck blocks in each of the four stages.
        num_classes: size of the output.
        base_width: inner channels of the first stage; the stem has this many channels and each
            later stage doubles it (64 gives ResNet-50; smaller values give cheap test models).
        zero_init_residual: start each block's last BatchNorm at zero, so blocks begin as identity.
    """

    expansion = 4

    def __init__(
        self,
        layers: Sequence[int] = (3, 4, 6, 3),
        num_classes: int = 1000,
        base_width: int = 64,
        zero_init_residual: bool = False,
    ) -> None:
        super().__init__()
        if len(layers) != 4:
            raise ValueError(f"ResNet needs block counts for 4 stages, got {tuple(layers)}")
        self.conv1 = nn.Conv2d(3, base_width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        channels = base_width
        stages = []
        for index, blocks in enumerate(layers):
            width = base_width * 2**index
            stride = 1 if index == 0 else 2
            stage, channels = self._make_stage(channels, width, blocks, stride)
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages

        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)
        self._init_weights(zero_init_residual)

    def _make_stage(
        self, in_channels: int, width: int, blocks: int, stride: int
    ) -> tuple[nn.Sequential, int]:
        """Build one stage; only its first block changes stride and channel count."""
        modules = [Bottleneck(in_channels, width, stride, self.expansion)]
        out_channels = width * self.expansion
        modules += [Bottleneck(out_channels, width, 1, self.expansion) for _ in range(1, blocks)]
        return nn.Sequential(*modules), out_channels

    def _init_weights(self, zero_init_residual: bool) -> None:
        """He initialisation for convolutions, unit/zero BatchNorm (torchvision's scheme)."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if zero_init_residual:
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.zeros_(module.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet50(
    num_classes: int = 1000,
    *,
    base_width: int = 64,
    layers: Sequence[int] = (3, 4, 6, 3),
    zero_init_residual: bool = False,
) -> ResNet:
    """ResNet-50 as in torchvision: 25,557,032 parameters with the default arguments.

    ``base_width`` and ``layers`` shrink the network for fast tests (for example ``base_width=8,
    layers=(1, 1, 1, 1)``); the defaults are the real model. Default input: (3, 224, 224).
    """
    return ResNet(layers, num_classes, base_width, zero_init_residual)
