"""The dense part of DLRM (Naumov et al. 2019) in torch: bottom MLP, pairwise interaction, top MLP.

The embedding tables live on the parameter servers; a worker receives the rows a batch needs,
makes them a leaf tensor, and gets their gradients from autograd to push back.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from airflow_dlrover.runtime.spec import JobSpec


def _mlp(sizes: list[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseDLRM(nn.Module):
    """logit = top([bottom(dense), dot products of all pairs of {bottom(dense), emb_1..emb_T}])."""

    def __init__(self, num_dense: int, num_tables: int, dim: int, bottom: tuple[int, ...], top: tuple[int, ...]):
        super().__init__()
        self.bottom = _mlp([num_dense, *bottom], final_activation=True)
        vectors = num_tables + 1
        self.pairs = torch.triu_indices(vectors, vectors, offset=1)
        interactions = vectors * (vectors - 1) // 2
        self.top = _mlp([dim + interactions, *top, 1], final_activation=False)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """``dense`` (n, num_dense); ``embedded`` (n, T, dim) → logits (n,)."""
        x = self.bottom(dense)
        vectors = torch.cat([x.unsqueeze(1), embedded], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def build_model(spec: JobSpec, num_dense: int = 13) -> DenseDLRM:
    """The job's dense model with its deterministic initial parameters (seeded by the job)."""
    torch.manual_seed(spec.seed)
    return DenseDLRM(num_dense, len(spec.table_sizes), spec.embedding_dim, spec.bottom_mlp, spec.top_mlp)


def flat_parameters(model: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().astype(np.float32)


def load_flat(model: nn.Module, flat: np.ndarray) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(flat[offset : offset + n]).view_as(p))
            offset += n


def flat_gradients(model: nn.Module) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().astype(np.float32)
