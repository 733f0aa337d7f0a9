"""What the drivers share: a small regression model and its synthetic data, the same in every session.

The data depend only on ``data_seed``, never on the training RNG, so an uninterrupted run and a resumed one see the
same samples, and any difference in the order they are drawn is the trainer's.
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 8
SAMPLES = 64


def synthetic(samples: int = SAMPLES, data_seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): ``samples`` inputs and noisy linear targets, a pure function of ``data_seed``."""
    g = torch.Generator().manual_seed(data_seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(samples, 1, generator=g)
    return x, y


class Regressor(nn.Module):
    """Two layers with dropout (so a resume that does not restore the RNG shows); returns {loss, logits}."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 1))

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor | None = None, idx: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        out = self.net(x)  # (B, 1)
        loss = nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out} if loss is not None else {"logits": out}


class Samples(torch.utils.data.Dataset):
    """The synthetic samples as dicts, each with its index (``idx``) so a batch says which samples it holds."""

    def __init__(self, data_seed: int = 1234) -> None:
        self.x, self.y = synthetic(data_seed=data_seed)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i], "idx": torch.tensor(i)}


def quiet_cpu() -> None:
    """One thread: the machine is shared, and one thread's sums are the same from run to run."""
    torch.set_num_threads(1)
