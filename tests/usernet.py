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


def labelled_batch(batch: int = 8, shape: tuple = (3, 16, 16)):
    """(images (batch, *shape) float32, classes (batch,) int64 in 0..4), seeded with 0: the example
    inputs and targets of the one-call tests."""
    torch.manual_seed(0)
    return torch.randn(batch, *shape), torch.randint(0, 5, (batch,))


def solved_usernet(x: torch.Tensor, fraction: float = 0.7, time_limit: float = 20):
    """(UserNet seeded with 0, its graph at ``x`` (B, 3, H, W), analytic costs, a normal-mode
    solution at ``fraction`` of plain PyTorch's simulated peak): the schedule tests share."""
    from monet.capture import capture
    from monet.profiling.costs import analytic_costs, costs_for
    from monet.solver.solve import eager_peak, solve

    torch.manual_seed(0)
    model = UserNet()
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    sol = solve(graph, costs, int(fraction * eager_peak(graph, costs)), "normal", time_limit=time_limit,
                info=dict(model="UserNet", batch_size=x.shape[0], input_shape=tuple(x.shape[1:]), dtype="float32"))
    return model, graph, costs, sol
