"""Shuffle quality: the block-shuffle specification's metrics and a chi-squared battery.

All functions take a materialised order ``perm`` (``perm[i]`` = source index of position ``i``),
as numpy, on the host: they judge a shuffle, they are not part of one.

    perm = [2, 0, 3, 1], io_block_size = 2
    mean_abs_displacement_norm = mean(|perm - i|) / (n - 1) = (2+1+1+2)/4/3 = 0.5
    same_block_transition_rate = mean(perm[1:] // 2 == perm[:-1] // 2) = 0/3
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ShuffleMetrics:
    """The specification's four headline metrics for one order."""

    mean_abs_displacement_norm: float
    inversion_fraction: float
    spearman_rho: float
    same_block_transition_rate: float


def inversion_count(perm: np.ndarray, chunk: int = 1024) -> int:
    """Pairs ``i < j`` with ``perm[i] > perm[j]``, counted exactly in O(n^2 / chunk) vector ops."""
    perm = np.asarray(perm)
    total = 0
    for start in range(0, perm.size, chunk):
        head = perm[start : start + chunk]
        # pairs inside the chunk, then this chunk against everything after it
        total += int(np.triu(head[:, None] > head[None, :], k=1).sum())
        rest = perm[start + chunk :]
        if rest.size:
            total += int(np.searchsorted(np.sort(rest), head).sum())
    return total


def shuffle_metrics(perm: np.ndarray, io_block_size: int) -> ShuffleMetrics:
    """The four metrics of ``perm``, with the specification's exact definitions."""
    perm = np.asarray(perm, dtype=np.int64)
    n = perm.size
    if n < 2:
        raise ValueError(f"need at least 2 positions to measure a shuffle (got n={n})")
    idx = np.arange(n)
    blocks = perm // io_block_size
    return ShuffleMetrics(
        mean_abs_displacement_norm=float(np.mean(np.abs(perm - idx)) / (n - 1)),
        inversion_fraction=inversion_count(perm) / (n * (n - 1) / 2),
        # For a permutation, ranks are the values: Pearson on them is Spearman's rho.
        spearman_rho=float(np.corrcoef(idx, perm)[0, 1]),
        same_block_transition_rate=float(np.mean(blocks[1:] == blocks[:-1])),
    )


def random_expectations(n: int, io_block_size: int) -> dict[str, float]:
    """What a uniformly random permutation of ``n`` scores on each metric."""
    sizes = [io_block_size] * (n // io_block_size) + ([n % io_block_size] if n % io_block_size else [])
    return {
        "mean_abs_displacement_norm": (n * n - 1) / (3 * n) / (n - 1),
        "inversion_fraction": 0.5,
        "spearman_rho": 0.0,
        "same_block_transition_rate": sum(s * (s - 1) for s in sizes) / (n * (n - 1)),
    }


def _chi2_uniform(table: np.ndarray) -> float:
    expected = table.sum() / table.size
    return float(((table - expected) ** 2 / expected).sum())


def chi2_battery(perm: np.ndarray, bits: int = 4) -> dict[str, float]:
    """Chi-squared statistics of two joint histograms, each ``2^bits x 2^bits`` cells.

    * ``input_output_low_bits``: (i mod 2^bits, perm[i] mod 2^bits) — does position leak into value?
    * ``lag1_low_bits``: (perm[i] mod 2^bits, perm[i+1] mod 2^bits) — do neighbours correlate?

    A random permutation gives about ``(2^bits - 1)^2`` degrees of freedom's worth (225 for 4 bits).
    """
    perm = np.asarray(perm, dtype=np.int64)
    cells = 1 << bits
    low = perm & (cells - 1)
    pos = np.arange(perm.size) & (cells - 1)
    io = np.bincount(pos * cells + low, minlength=cells * cells)
    lag = np.bincount(low[:-1] * cells + low[1:], minlength=cells * cells)
    return {"input_output_low_bits": _chi2_uniform(io), "lag1_low_bits": _chi2_uniform(lag)}
