"""GoogLeNet / Inception v1 (Szegedy et al., "Going Deeper with Convolutions", 2014).

Laid out as ``torchvision.models.googlenet(aux_logits=False, transform_input=False)``: 6,624,904
parameters with 1000 classes. Two details follow torchvision rather than the paper:

* every convolution is ``BasicConv2d``: a bias-free convolution, BatchNorm(eps=0.001) and an
  in-place ReLU (the paper has no BatchNorm and uses local response normalisation instead);
* the third Inception branch uses a 3x3 convolution where the paper has a 5x5 one.

There are no auxiliary classifiers, so the model returns a plain logits tensor in training mode too.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicConv2d", "Inception", "GoogLeNet", "googlenet"]


class BasicConv2d(nn.Module):
    """Bias-free convolution, BatchNorm with eps 0.001, in-place ReLU.

    The submodules are named ``conv`` and ``bn`` so that state dicts use torchvision's keys.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class Inception(nn.Module):
    """Four parallel branches concatenated along channels; the spatial size is unchanged.

    Args:
        in_channels: channels entering the module.
        ch1x1: output of the 1x1 branch.
        ch3x3_reduce, ch3x3: 1x1 reduction then 3x3 convolution.
        ch5x5_reduce, ch5x5: 1x1 reduction then the "5x5" branch (a 3x3 convolution, as in
            torchvision).
        pool_proj: 3x3/1 max-pool then a 1x1 projection to this many channels.
    """

    def __init__(self, in_channels: int, ch1x1: int, ch3x3_reduce: int, ch3x3: int,
                 ch5x5_reduce: int, ch5x5: int, pool_proj: int) -> None:
        super().__init__()
        self.branch1 = BasicConv2d(in_channels, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(
            BasicConv2d(in_channels, ch3x3_reduce, kernel_size=1),
            BasicConv2d(ch3x3_reduce, ch3x3, kernel_size=3, padding=1),
        )
        self.branch3 = nn.Sequential(
            BasicConv2d(in_channels, ch5x5_reduce, kernel_size=1),
            BasicConv2d(ch5x5_reduce, ch5x5, kernel_size=3, padding=1),
        )
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
            BasicConv2d(in_channels, pool_proj, kernel_size=1),
        )
        self.out_channels = ch1x1 + ch3x3 + ch5x5 + pool_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = (self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x))
        return torch.cat(branches, dim=1)


class GoogLeNet(nn.Module):
    """GoogLeNet without auxiliary heads for images (N, 3, H, W); returns logits (N, num_classes).

    Any H, W of at least 32 works (the network downsamples by 32 with ceil-mode pools, then pools
    globally).

    Args:
        num_classes: size of the output.
        dropout: dropout probability before the last linear layer.
        width_div: divide every channel count by this (1 = the real network; small test
            variants use 8).
    """

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2, width_div: int = 1) -> None:
        super().__init__()

        def c(*channels):
            return [max(1, ch // width_div) for ch in channels]

        self.conv1 = BasicConv2d(3, *c(64), kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = BasicConv2d(*c(64, 64), kernel_size=1)
        self.conv3 = BasicConv2d(*c(64, 192), kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)

        self.inception3a = Inception(*c(192, 64, 96, 128, 16, 32, 32))
        self.inception3b = Inception(*c(256, 128, 128, 192, 32, 96, 64))
        self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)

        self.inception4a = Inception(*c(480, 192, 96, 208, 16, 48, 64))
        self.inception4b = Inception(*c(512, 160, 112, 224, 24, 64, 64))
        self.inception4c = Inception(*c(512, 128, 128, 256, 24, 64, 64))
        self.inception4d = Inception(*c(512, 112, 144, 288, 32, 64, 64))
        self.inception4e = Inception(*c(528, 256, 160, 320, 32, 128, 128))
        self.maxpool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)

        self.inception5a = Inception(*c(832, 256, 160, 320, 32, 128, 128))
        self.inception5b = Inception(*c(832, 384, 192, 384, 48, 128, 128))

        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(self.inception5b.out_channels, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """Truncated N(0, 0.01) for convolutions and linear layers, unit/zero BatchNorm."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(module.weight, mean=0.0, std=0.01, a=-2.0, b=2.0)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        x = self.inception4c(self.inception4b(self.inception4a(x)))
        x = self.maxpool4(self.inception4e(self.inception4d(x)))
        x = self.inception5b(self.inception5a(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(self.dropout(x))


def googlenet(num_classes: int = 1000, *, dropout: float = 0.2, width_div: int = 1) -> GoogLeNet:
    """GoogLeNet as torchvision builds it without auxiliary heads: 6,624,904 parameters.

    Default input: (3, 224, 224).  ``width_div`` > 1 builds a narrower variant for fast tests.
    """
    return GoogLeNet(num_classes, dropout, width_div)
