"""The job's dense model: our DLRM (Naumov et al. 2019: bottom MLP, pairwise interaction, top MLP),
or the user's own, named by an import path.

The embedding tables live on the parameter servers; a worker receives the rows a batch needs,
makes them a leaf tensor, pools them per table, and gets their gradients from autograd to push back.

**The user's model** (``JobSpec.model = "pkg.module:build"``): ``build(layout)`` takes the job's
:class:`~airflow_dlrover.runtime.layout.FeatureLayout` and returns a ``torch.nn.Module`` whose
``forward(dense, embedded)`` maps ``dense`` (n, num_dense) float32 and ``embedded`` (a list, one
(n, dim_t) tensor per sparse column, pooled for multi-hot ones) to logits (n,). The module is
imported from the Python path (locally) or the image (Kubernetes). :func:`build_model` checks the
contract on a small batch and raises :class:`ModelError` (a user error) with the traceback.
"""

from __future__ import annotations

import importlib
import traceback

import numpy as np
import torch
from torch import nn

from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec

#: rows of the batch on which a model is checked before the job trains
CHECK_ROWS = 4


def _mlp(sizes: list[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseDLRM(nn.Module):
    """logit = top([bottom(dense), dot products of all pairs of {bottom(dense), emb_1..emb_T}]).

    The pairs are taken from the flattened Gram matrix with ``index_select``, whose backward is one
    ``index_add`` (advanced indexing's is an accumulating ``index_put``, twice the interaction's time
    on a CPU core)."""

    def __init__(self, num_dense: int, num_tables: int, dim: int, bottom: tuple[int, ...], top: tuple[int, ...]):
        super().__init__()
        self.bottom = _mlp([num_dense, *bottom], final_activation=True)
        vectors = num_tables + 1
        upper = torch.triu_indices(vectors, vectors, offset=1)
        # positions of the upper triangle in the flat Gram matrix (a buffer: it moves with the model)
        self.register_buffer("pairs", upper[0] * vectors + upper[1], persistent=False)
        interactions = vectors * (vectors - 1) // 2
        self.top = _mlp([dim + interactions, *top, 1], final_activation=False)

    def forward(self, dense: torch.Tensor, embedded: list[torch.Tensor]) -> torch.Tensor:
        """``dense`` (n, num_dense); ``embedded`` T tensors (n, dim) → logits (n,)."""
        x = self.bottom(dense)
        vectors = torch.stack([x, *embedded], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1).index_select(1, self.pairs)
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


class ModelError(InvalidInputError):
    """The user's model cannot be imported, built or run, or breaks the contract: a user error."""

    def __init__(self, model: str, allowed: str, detail: str = ""):
        super().__init__("model", model, allowed, detail)


def build_model(spec: JobSpec) -> nn.Module:
    """The job's dense model with its deterministic initial parameters (seeded by the job), its
    contract checked on ``CHECK_ROWS`` rows of zeros (:class:`ModelError` otherwise)."""
    torch.manual_seed(spec.seed)
    layout = spec.layout
    if not spec.model:
        return DenseDLRM(layout.num_dense, len(layout.sparse), layout.dims[0], spec.bottom_mlp, spec.top_mlp)
    module_name, _, function = spec.model.partition(":")
    contract = "pkg.module:build, build(layout) → torch.nn.Module with forward(dense, embedded) → logits (n,)"
    try:
        build = getattr(importlib.import_module(module_name), function)
        model = build(layout)
    except Exception:  # noqa: BLE001 - the user's code may raise anything: report it whole
        raise ModelError(spec.model, contract, traceback.format_exc(limit=-8)) from None
    if not isinstance(model, nn.Module):
        raise ModelError(spec.model, contract, f"build returned {type(model).__name__}, not a torch.nn.Module")
    dense = torch.zeros(CHECK_ROWS, layout.num_dense)
    embedded = [torch.zeros(CHECK_ROWS, dim) for dim in layout.dims]
    try:
        logits = model(dense, embedded)
    except Exception:  # noqa: BLE001
        raise ModelError(spec.model, contract, "forward failed on a batch of zeros:\n" + traceback.format_exc(limit=-8)) from None
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (CHECK_ROWS,):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ModelError(spec.model, contract, f"forward returned {shape} for {CHECK_ROWS} rows: allowed ({CHECK_ROWS},)")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError(spec.model, contract, "the module has no trainable parameters")
    torch.manual_seed(spec.seed)  # the initial parameters do not depend on the check
    return build(layout)


class FlatParameters:
    """A model's parameters and their gradients as views of one flat tensor each (the layout of
    the dense vector the PS holds, ``model.parameters()`` in order): a step loads the PS's vector
    with one copy, zeroes the gradients with one fill and reads them without a concatenation.
    Autograd accumulates into a defined ``.grad`` in place, so the views stay the gradients."""

    def __init__(self, model: nn.Module):
        params = list(model.parameters())
        self.values = torch.cat([p.detach().reshape(-1) for p in params]) if params else torch.zeros(0)
        self.grads = torch.zeros_like(self.values)
        offset = 0
        for p in params:
            n = p.numel()
            p.data = self.values[offset : offset + n].view_as(p)
            p.grad = self.grads[offset : offset + n].view_as(p)
            offset += n

    def numpy(self) -> np.ndarray:
        """The parameters, a float32 copy."""
        return self.values.detach().cpu().numpy().astype(np.float32)

    def load(self, flat: np.ndarray) -> None:
        with torch.no_grad():
            self.values.copy_(torch.from_numpy(np.asarray(flat)))

    def zero_grad(self) -> None:
        self.grads.zero_()

    def gradients(self) -> np.ndarray:
        """The gradients, a float32 copy (zeros for a parameter the batch did not reach)."""
        return self.grads.cpu().numpy().astype(np.float32)
