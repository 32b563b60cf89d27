"""Small networks: enough to prove a pipeline end to end on a CPU."""

from __future__ import annotations

import torch
from torch import nn


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)
    )


class SmallCNN(nn.Module):
    """Three conv stages and a global pool: any input size, about 100k parameters at width 32."""

    def __init__(self, num_classes: int, width: int = 32, in_channels: int = 3):
        super().__init__()
        self.features = nn.Sequential(
            _block(in_channels, width),
            nn.MaxPool2d(2),
            _block(width, 2 * width),
            nn.MaxPool2d(2),
            _block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        return self.head(self.features(x))


class SmallUNet(nn.Module):
    """A three-level U-Net for per-pixel classes: (N, C, H, W) -> (N, num_classes, H, W), H and W multiples
    of 8. About 120k parameters at width 16: enough to segment small images on a CPU in a minute."""

    def __init__(self, num_classes: int, width: int = 16, in_channels: int = 3):
        super().__init__()
        w = width
        self.down = nn.ModuleList([_block(in_channels, w), _block(w, 2 * w), _block(2 * w, 4 * w)])
        self.bottom = _block(4 * w, 4 * w)
        self.up = nn.ModuleList([_block(8 * w, 2 * w), _block(4 * w, w), _block(2 * w, w)])
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Conv2d(w, num_classes, 1)

    def forward(self, x):
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for block, skip in zip(self.up, reversed(skips)):
            x = nn.functional.interpolate(x, size=skip.shape[-2:], mode="nearest")
            x = block(torch.cat([x, skip], dim=1))
        return self.head(x)
