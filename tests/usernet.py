"""A model of a user's own, shared by the tests (not a zoo model)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Mish(nn.Module):
    """A custom activation written in Python: x * tanh(softplus(x))."""

    def forward(self, x):
        return x * torch.tanh(F.softplus(x))


class UserNet(nn.Module):
    """A model of the user's own: residual branch, custom activation, in-place op, BatchNorm, dropout."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.act = Mish()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.Conv2d(c, c, 3, padding=1)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        y = self.act(self.bn1(self.stem(x)))
        r = self.conv3(F.relu(self.bn2(self.conv2(y))))
        r.add_(y)  # in-place residual add
        z = F.relu_(r)  # in-place activation
        return self.head(self.drop(z.mean(dim=(2, 3))))
