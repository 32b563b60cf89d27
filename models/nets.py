"""Small networks: enough to prove a pipeline end to end on a CPU."""

from __future__ import annotations

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
