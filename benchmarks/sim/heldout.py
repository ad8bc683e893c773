"""Held-out performance families: generators the throughput model was never tuned on.

They exist to judge the model, not to drive the cluster simulation (``sim.truth`` does that), and
they are built from mechanisms neither ``sim.truth`` nor the model's q-norm use. Their parameters
are drawn from ``HELD_OUT_SEEDS``, frozen before any tuning of the model against them: a change to
the model is judged on them as they are, never the other way round.

``forkjoin``  A closed network solved by mean value analysis (Reiser & Lavenberg, JACM 1980) with
              the fork-join approximation of a synchronous step: each of the w workers (the
              customers) computes for Z = o + B·c_w / s_w(λw) + p·c_send (a delay station: its
              own cores; c_send the worker's cost of issuing one request, so fan-out to more PS
              costs the worker), then sends one request to each of the p PS and waits for the
              slowest. A PS is a queueing station with demand D = (c_req + B·c_row·share) / s_p(λp)
              per request; a hot PS carries share = max(1/p, h) of the rows. The step's wait for
              p replies is the expected maximum of p exponential responses, H_p·R (H_p the
              harmonic number), or the hot PS's own response when it is slower.
``usl``       Gunther's universal scalability law over workers, X_w = w·x1 / (1 + σ(w−1) +
              κ·w(w−1)), against PS queues in M/M/1 form: the step takes t = t_w + t_ps / (1 − ρ),
              ρ = w·t_ps / t the PS utilisation, solved exactly (a quadratic in t).

Cores scale a node by Amdahl's law above one core, s(λ) = 1 / ((1 − f) + f/λ), and by a CFS
quota below it, s(λ) = λ·(1 − loss·(1 − λ)) (a throttled thread also loses its cache and
the period's tail): neither is a power of λ, nor the model's 1/λ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The seeds of the held-out families, frozen before tuning (three draws of each generator).
HELD_OUT_SEEDS = (11, 12, 13)


def node_speed(cores, parallel_fraction: float, cfs_loss: float) -> np.ndarray:
    """Speed of a node on λ cores relative to one core: Amdahl above one core, a CFS quota below."""
    cores = np.asarray(cores, dtype=float)
    above = 1.0 / ((1.0 - parallel_fraction) + parallel_fraction / np.maximum(cores, 1.0))
    below = cores * (1.0 - cfs_loss * (1.0 - cores))
    return np.where(cores >= 1.0, above, below)


def _harmonic(p: np.ndarray) -> np.ndarray:
    """H_p = Σ_{k ≤ p} 1/k, exact for the integers p ≤ 4096 (the maximum of p exponentials)."""
    table = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, 4097))])
    return table[np.asarray(p, dtype=int)]


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


@dataclass(frozen=True)
class HeldOutFamily:
    """One held-out PS family: its generator, its seed and the parameters drawn from it."""

    generator: str
    seed: int
    batch: int
    overhead_s: float  # o: fixed per-step cost of a worker (s)
    worker_core_s: float  # c_w: dense compute per sample on one core (core-s)
    worker_parallel: float  # Amdahl's parallel fraction of a worker's threads
    send_s: float  # c_send: a worker's cost of one request to one PS (s)
    row_core_s: float  # c_row: PS lookups and updates per sample, all tables (core-s)
    request_core_s: float  # c_req: a PS's fixed cost per request (core-s)
    ps_parallel: float  # Amdahl's parallel fraction of a PS's threads
    hot_share: float  # h: the hottest PS's least share of the rows
    cfs_loss: float  # throttling loss below one core
    serial: float  # σ (usl)
    crosstalk: float  # κ (usl)

    @property
    def name(self) -> str:
        return f"{self.generator}:{self.seed}"

    @classmethod
    def draw(cls, generator: str, seed: int, batch: int = 512) -> "HeldOutFamily":
        if generator not in GENERATORS:
            raise ValueError(f"generator {generator!r}: one of {GENERATORS}")
        rng = np.random.default_rng([seed, GENERATORS.index(generator)])
        return cls(
            generator=generator, seed=seed, batch=batch,
            overhead_s=_log_uniform(rng, 1e-3, 5e-3),
            worker_core_s=_log_uniform(rng, 2e-5, 1e-4),
            worker_parallel=float(rng.uniform(0.75, 0.97)),
            send_s=_log_uniform(rng, 1e-4, 6e-4),
            row_core_s=_log_uniform(rng, 5e-6, 4e-5),
            request_core_s=_log_uniform(rng, 2e-4, 1e-3),
            ps_parallel=float(rng.uniform(0.5, 0.9)),
            hot_share=float(rng.uniform(0.0, 0.2)),
            cfs_loss=float(rng.uniform(0.0, 0.4)),
            serial=_log_uniform(rng, 1e-3, 3e-2),
            crosstalk=_log_uniform(rng, 1e-5, 3e-4),
        )

    def throughput(self, w, p, lw, lp) -> np.ndarray:
        """Samples/s of each configuration (arrays broadcast; p ≥ 1)."""
        w, p, lw, lp = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(w, p, lw, lp))
        B = float(self.batch)
        s_w = node_speed(lw, self.worker_parallel, self.cfs_loss)
        s_p = node_speed(lp, self.ps_parallel, self.cfs_loss)
        share = np.maximum(1.0 / p, self.hot_share)
        if self.generator == "forkjoin":
            return B * self._forkjoin(w, p, s_w, s_p, share)
        compute = self.overhead_s + B * self.worker_core_s / s_w + p * self.send_s
        t_w = compute * (1.0 + self.serial * (w - 1.0) + self.crosstalk * w * (w - 1.0))
        t_ps = (self.request_core_s + B * self.row_core_s * share) / s_p
        # t = t_w + t_ps / (1 − w·t_ps/t)  ⇔  t² − t·(t_w + (w + 1)·t_ps) + w·t_w·t_ps = 0: the larger root
        b = t_w + (w + 1.0) * t_ps
        t = 0.5 * (b + np.sqrt(b * b - 4.0 * w * t_w * t_ps))
        return w * B / t

    def _forkjoin(self, w, p, s_w, s_p, share) -> np.ndarray:
        """Steps/s by MVA over the customers n = 1 … w (each configuration stops at its own w)."""
        B = float(self.batch)
        think = self.overhead_s + B * self.worker_core_s / s_w + p * self.send_s
        hot = (self.request_core_s + B * self.row_core_s * share) / s_p
        rest = (self.request_core_s + B * self.row_core_s * (1.0 - share) / np.maximum(p - 1.0, 1.0)) / s_p
        spread = _harmonic(np.maximum(p - 1.0, 1.0))
        q_hot, q_rest = np.zeros_like(w), np.zeros_like(w)
        steps = np.zeros_like(w)
        for n in range(1, int(w.max()) + 1):
            active = n <= w
            r_hot, r_rest = hot * (1.0 + q_hot), rest * (1.0 + q_rest)
            wait = np.where(p > 1, np.maximum(r_hot, spread * r_rest), r_hot)
            x = n / (think + wait)
            steps = np.where(active, x, steps)
            q_hot = np.where(active, x * r_hot, q_hot)
            q_rest = np.where(active, x * r_rest, q_rest)
        return steps


GENERATORS = ("forkjoin", "usl")


def held_out_families() -> list[HeldOutFamily]:
    """Every generator at every frozen seed."""
    return [HeldOutFamily.draw(generator, seed) for generator in GENERATORS for seed in HELD_OUT_SEEDS]
