"""Validating preblocked data: the jitted structure check over batches of blocks, and its report.

    report = validate_path("/data/blocks", carry_open_doc=True)
    report.ok                  # no anomaly (literal markers down-ranked by the heuristics do not count)
    report.counts              # {"nested_doc": 0, "stray_eod": 0, ..., "literal_eod": 0}
    report.to_json()           # {"path": ..., "options": ..., "counts": ..., "anomalies": [...]}

Each anomaly names its block, position, kind, the heuristic that down-ranked it (``None`` for a
structural anomaly) and the tokens around it::

    {"block": 17, "position": 3, "kind": "literal_eod", "severity": "literal",
     "heuristic": "H2: no [DOC] within 8 positions after an [EOD] outside any document",
     "context_start": 0, "tokens": [257, 97, 258, 258, 259, 259, 259, 259, 259, 259, 259, 259]}

See ``meshbatch.kernels.preblocked.structure`` for the kinds and the two heuristics.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from meshbatch.arguments import check_bool, check_int
from meshbatch.kernels import validate_blocks
from meshbatch.kernels.internal import ANOMALY_KINDS, LITERAL_KINDS

from .block_sources import BlockSource, int32_ids, open_blocks
from .block_store import check_path, resolve_ids

logger = logging.getLogger(__name__)

HEURISTICS = {
    "literal_doc": "H1: a [DOC] inside an open document, flanked only by structural/pad tokens",
    "literal_eod": "H2: no [DOC] within {window} positions after an [EOD] outside any document",
}


@dataclasses.dataclass(frozen=True)
class Anomaly:
    """One finding; ``tokens`` are the block's tokens from ``context_start`` on."""

    block: int
    position: int
    kind: str
    heuristic: str | None
    context_start: int
    tokens: list[int]

    @property
    def severity(self) -> str:
        return "literal" if self.kind in LITERAL_KINDS else "anomaly"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "severity": self.severity}


@dataclasses.dataclass
class BlockReport:
    """What ``validate_path``/``validate_array`` found."""

    path: str
    blocks: int
    options: dict[str, Any]
    counts: dict[str, int]
    anomalies: list[Anomaly]

    @property
    def ok(self) -> bool:
        """No anomaly; literal markers the heuristics down-ranked do not count."""
        return all(n == 0 for kind, n in self.counts.items() if kind not in LITERAL_KINDS)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "blocks": self.blocks,
            "ok": self.ok,
            "options": self.options,
            "counts": self.counts,
            "anomalies": [a.to_dict() for a in self.anomalies],
        }

    def format(self) -> str:
        lines = [f"{self.path}: {self.blocks} blocks, {'clean' if self.ok else 'ANOMALIES FOUND'}"]
        lines += [f"  {kind:<20} {n}" for kind, n in self.counts.items()]
        return "\n".join(lines)


def validate_path(
    path: str,
    *,
    carry_open_doc: bool = False,
    literal_heuristics: bool = False,
    literal_window: int = 8,
    doc_id: int | None = None,
    eod_id: int | None = None,
    pad_id: int | None = None,
    vocab_size: int | None = None,
    batch_blocks: int = 1024,
    context: int = 8,
    progress: bool | None = None,
) -> BlockReport:
    """Validates a preblocked store or ``chunk*.npy`` directory, batch by batch.

    Args:
        carry_open_doc: a document may continue into the next block.
        literal_heuristics: down-rank ambiguous markers (H1, H2; ``meshbatch.kernels.preblocked.structure``).
        literal_window: H2's "nearby": positions after the ``[EOD]`` searched for a ``[DOC]``.
        doc_id, eod_id, pad_id, vocab_size: override the header's (required without one).
        batch_blocks: blocks per kernel call.
        context: tokens kept on each side of an anomaly.
        progress: show a progress bar; ``None``: only on a terminal.

    Raises:
        FileNotFoundError, ValueError: ``path`` cannot be read as preblocked data.
    """
    source = open_blocks(check_path("path", path), pad_id=pad_id)
    given = {"doc_id": doc_id, "eod_id": eod_id, "pad_id": pad_id, "vocab_size": vocab_size}
    return _validate(
        source,
        path,
        given,
        carry_open_doc,
        literal_heuristics,
        literal_window,
        batch_blocks,
        context,
        progress,
    )


def validate_array(
    blocks: np.ndarray, *, doc_id: int, eod_id: int, pad_id: int, vocab_size: int, **options
) -> BlockReport:
    """``validate_path`` for an in-memory ``[N, block_size]`` array (same options; no progress bar
    by default)."""
    given = {"doc_id": doc_id, "eod_id": eod_id, "pad_id": pad_id, "vocab_size": vocab_size}
    return _validate(_ArrayBlocks(np.asarray(blocks)), "<array>", given, **{"progress": False, **options})


class _ArrayBlocks:
    def __init__(self, blocks: np.ndarray):
        if blocks.ndim != 2 or not np.issubdtype(blocks.dtype, np.integer):
            raise ValueError(
                f"blocks must be a [N, block_size] integer array (got {blocks.dtype} {blocks.shape})"
            )
        self.array, self.header = int32_ids(blocks, "blocks", "blocks"), None
        self.num_blocks, self.block_size = blocks.shape

    def read_blocks(self, indices) -> np.ndarray:
        return self.array[np.asarray(indices)]


def _validate(
    source: BlockSource,
    path: str,
    given: dict,
    carry_open_doc: bool = False,
    literal_heuristics: bool = False,
    literal_window: int = 8,
    batch_blocks: int = 1024,
    context: int = 8,
    progress: bool | None = None,
) -> BlockReport:
    ids = resolve_ids([source], given)
    check_bool("carry_open_doc", carry_open_doc)
    check_bool("literal_heuristics", literal_heuristics)
    check_int("literal_window", literal_window, low=1, high=2**31 - 1)
    check_int("batch_blocks", batch_blocks, low=1, high=2**20)
    check_int("context", context, low=0, high=2**31 - 1)
    if progress is not None:
        check_bool("progress", progress)
    options = {
        "carry_open_doc": carry_open_doc,
        "literal_heuristics": literal_heuristics,
        "literal_window": literal_window,
        **ids,
    }
    counts = dict.fromkeys(ANOMALY_KINDS, 0)
    anomalies: list[Anomaly] = []
    n, S = source.num_blocks, source.block_size
    carry = jnp.bool_(False)
    disable = None if progress is None else not progress
    with tqdm(total=n, desc=f"validating {path}", unit="block", disable=disable) as bar:
        for lo in range(0, n, batch_blocks):
            hi = min(n, lo + batch_blocks)
            rows = source.read_blocks(np.arange(lo, hi))
            padded = np.full((batch_blocks, S), ids["pad_id"], np.int32)
            padded[: hi - lo] = rows
            found = validate_blocks(
                jnp.asarray(padded), jnp.int32(hi - lo), carry, jnp.bool_(hi == n), **options
            )
            carry = found.carry_out
            codes, unclosed = np.asarray(found.codes), np.asarray(found.unclosed)
            hits = [
                (int(b), int(p), ANOMALY_KINDS[int(codes[b, p]) - 1])
                for b, p in zip(*np.nonzero(codes), strict=True)
            ]
            hits += [(int(b), int(unclosed[b]), "unclosed_doc") for b in np.flatnonzero(unclosed >= 0)]
            for b, p, kind in sorted(hits):
                counts[kind] += 1
                first = max(0, p - context)
                heuristic = HEURISTICS.get(kind, "").format(window=literal_window) or None
                anomalies.append(
                    Anomaly(lo + b, p, kind, heuristic, first, rows[b, first : p + context + 1].tolist())
                )
            bar.update(hi - lo)
    return BlockReport(path, n, options, counts, anomalies)
