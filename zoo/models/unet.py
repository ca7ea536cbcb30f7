"""U-Net (Ronneberger et al., "U-Net: Convolutional Networks for Biomedical Image
Segmentation", 2015).

Laid out as milesial's Pytorch-UNet ``UNet(n_channels, n_classes, bilinear=False)``, the code MONeT's
experiments started from: 31,037,698 parameters for 3 input channels and 2 classes.

* ``DoubleConv``: twice (3x3 convolution with padding 1 and no bias, BatchNorm, in-place ReLU);
* the encoder: ``DoubleConv`` to 64 channels, then four ``Down`` steps (2x2 max-pool, ``DoubleConv``)
  to 128, 256, 512 and 1024 channels;
* the decoder: four ``Up`` steps, each a 2x2/2 transposed convolution that halves the channels,
  zero padding when the skip connection is larger (odd sizes), concatenation with the skip, and
  ``DoubleConv``;
* a 1x1 convolution (with bias) to ``n_classes`` logits per pixel.

The convolutions inside ``DoubleConv`` have no bias, as in milesial's current code (older versions,
and MONeT's copy, keep the bias: 5,888 parameters more). Submodule names follow milesial's, so its
state dicts load as they are. Padding is applied only where the sizes differ: with static shapes (as
in a traced graph) a side divisible by 16 adds no pad node, and other sizes still produce an output
as large as the input.

MONeT's own copy (``models/unet`` in utsaslab/MONeT) differs: it halves the bottleneck (factor 2),
upsamples with ``AdaptiveAvgPool2d`` to fixed sizes instead of transposed convolutions, keeps conv
biases and used 1 class at 3x416x608. This module follows the upstream milesial layout instead.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["DoubleConv", "Down", "Up", "OutConv", "UNet", "unet"]


class DoubleConv(nn.Module):
    """(3x3 convolution without bias, BatchNorm, in-place ReLU) twice; keeps the spatial size."""

    def __init__(
        self, in_channels: int, out_channels: int, mid_channels: int | None = None
    ) -> None:
        super().__init__()
        mid_channels = mid_channels or out_channels
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(mid_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.double_conv(x)


class Down(nn.Module):
    """Halve the spatial size with a 2x2 max-pool, then ``DoubleConv``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool_conv(x)


class Up(nn.Module):
    """Double the spatial size with a transposed convolution, join the skip connection, convolve.

    Args:
        in_channels: channels of the coarse input; the transposed convolution halves them, and the
            skip connection is expected to bring the other half.
        out_channels: channels after the ``DoubleConv``.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, coarse: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        coarse = self.up(coarse)
        pad_h = skip.shape[-2] - coarse.shape[-2]
        pad_w = skip.shape[-1] - coarse.shape[-1]
        if pad_h or pad_w:
            coarse = F.pad(coarse, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        return self.conv(torch.cat([skip, coarse], dim=1))


class OutConv(nn.Module):
    """1x1 convolution (with bias) from features to one logit map per class."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class UNet(nn.Module):
    """U-Net for images (N, n_channels, H, W); returns logits (N, n_classes, H, W).

    Any H, W of at least 16 works; sides that are not multiples of 16 are handled by padding in
    the decoder.

    Args:
        n_channels: input channels.
        n_classes: output channels (one logit map per class).
        base_channels: width of the first level; each level doubles it (64 is the real model,
            smaller values give cheap test models).
    """

    def __init__(self, n_channels: int = 3, n_classes: int = 2, base_channels: int = 64) -> None:
        super().__init__()
        self.n_channels = n_channels
        self.n_classes = n_classes
        c = base_channels
        self.inc = DoubleConv(n_channels, c)
        self.down1 = Down(c, 2 * c)
        self.down2 = Down(2 * c, 4 * c)
        self.down3 = Down(4 * c, 8 * c)
        self.down4 = Down(8 * c, 16 * c)
        self.up1 = Up(16 * c, 8 * c)
        self.up2 = Up(8 * c, 4 * c)
        self.up3 = Up(4 * c, 2 * c)
        self.up4 = Up(2 * c, c)
        self.outc = OutConv(c, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x = self.down4(x4)
        x = self.up1(x, x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        x = self.up4(x, x1)
        return self.outc(x)


def unet(n_channels: int = 3, n_classes: int = 2, *, base_channels: int = 64) -> UNet:
    """milesial's U-Net with transposed-convolution upsampling: 31,037,698 parameters by default.

    Default input in the zoo: (3, 416, 608), the size MONeT's UNet experiments used.
    """
    return UNet(n_channels, n_classes, base_channels)
