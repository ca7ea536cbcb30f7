"""The check the distributed tests share: ranks, each on its share of a batch, against one plain
PyTorch process on the whole batch."""
import copy

import torch
import torch.nn.functional as F


def assert_matches_one_process(model, x, y, ranks: list[dict], steps: int, lr: float) -> None:
    """Each rank's ``losses``, ``grads`` (per step, in ``named_parameters()`` order) and final
    ``params`` equal plain SGD on the whole batch (the mean of the ranks' losses), within 1e-5."""
    plain = copy.deepcopy(model)
    opt = torch.optim.SGD(plain.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(plain(x), y)
        loss.backward()
        mean_of_halves = torch.stack([r["losses"][step] for r in ranks]).mean()
        torch.testing.assert_close(mean_of_halves, loss.detach(), rtol=1e-5, atol=1e-6)
        for r in ranks:
            for (name, p), g in zip(plain.named_parameters(), r["grads"][step]):
                torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, s=step, n=name: f"step {s} {n}: {m}")
        opt.step()
    for r in ranks:
        for (name, p), q in zip(plain.named_parameters(), r["params"]):
            torch.testing.assert_close(q, p.detach(), rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
