"""The examples of a chat or supervised cache, as Levanter writes them, checked once at open.

A chat cache (Levanter's ``ChatProcessor``) holds two jagged fields of equal row lengths:
``input_ids`` and ``assistant_masks`` (1 on the tokens of assistant turns). A supervised cache
(``SupervisedProcessor``) holds ``input_ids`` and ``sources_len``, one value per row: the prompt
tokens at the start of the example. Example ``i`` is row ``i``; its length comes from the offsets.

Damaged input is refused here by name (``PackedDataError``, naming the cache, the field and the
row): an empty example, an ``assistant_masks`` row whose length differs from its ``input_ids``
row or that holds a value other than 0 or 1, a ``sources_len`` row that is not one value, or a
``sources_len`` that is negative or past its example.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from meshbatch.cache import TokenCache

logger = logging.getLogger(__name__)

FORMATS = ("chat", "supervised")
MASK_FIELD = {"chat": "assistant_masks", "supervised": "sources_len"}
MASK_CHECK_TOKENS = 1 << 24  # assistant_masks values checked per read at open (64 MiB of int32)


class PackedDataError(ValueError):
    """A chat or supervised cache whose rows cannot be examples: names the cache, field and row."""


@dataclass(frozen=True)
class Examples:
    """The examples of one cache.

    Attributes:
        format: ``"chat"`` or ``"supervised"``.
        tokens: the ``input_ids`` field.
        masks: the ``assistant_masks`` field (chat), else ``None``.
        offsets: int64 ``[n + 1]`` token offsets of the examples in ``input_ids``.
        lengths: int64 ``[n]`` tokens per example.
        sources_len: int32 ``[n]`` prompt tokens per example (supervised), else ``None``.
    """

    format: str
    tokens: TokenCache
    masks: TokenCache | None
    offsets: np.ndarray
    lengths: np.ndarray
    sources_len: np.ndarray | None

    @property
    def path(self) -> str:
        return self.tokens.path

    @property
    def num_examples(self) -> int:
        return int(self.lengths.shape[0])


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def _check_mask_values(masks: TokenCache, offsets: np.ndarray, path: str) -> None:
    """Refuses an ``assistant_masks`` value other than 0 or 1, naming the row: reads the field once,
    ``MASK_CHECK_TOKENS`` at a time, one vectorised comparison per chunk."""
    total = int(offsets[-1])
    if total > MASK_CHECK_TOKENS:  # a long read at open: say what it is
        logger.info("checking the %d assistant_masks values of chat cache %s (0 or 1 each)", total, path)
    for lo in range(0, total, MASK_CHECK_TOKENS):
        hi = min(total, lo + MASK_CHECK_TOKENS)
        values = np.asarray(masks.read_runs(np.array([lo], np.int64), np.array([hi - lo], np.int64)).buffer)
        bad = np.flatnonzero((values != 0) & (values != 1))
        if bad.size:
            at = lo + int(bad[0])
            row = int(np.searchsorted(offsets, at, side="right")) - 1
            value = values[bad[0]].item()
            raise PackedDataError(
                f"chat cache {path}: row {row} has assistant_masks value {value} at its token "
                f"{at - int(offsets[row])} (a mask holds 0 or 1)"
            )


def open_examples(path: str, format: str | None = None) -> Examples:
    """Opens and checks the chat or supervised cache at ``path`` (``format``: ``None`` detects it
    from the fields present).

    Raises:
        FileNotFoundError: no token cache at ``path``, or without the format's field.
        ValueError: neither or both of ``assistant_masks`` and ``sources_len`` when ``format`` is
            ``None``.
        PackedDataError: damaged rows (see the module docstring), naming the cache and the row.
    """
    tokens = TokenCache.open(path, "input_ids")
    if format is None:
        present = {}
        for fmt, field in MASK_FIELD.items():
            try:
                present[fmt] = TokenCache.open(path, field)
            except FileNotFoundError:
                continue
        if len(present) != 1:
            raise ValueError(
                f"cannot tell the format of the cache at {path}: it has "
                f"{[MASK_FIELD[f] for f in present] or 'neither assistant_masks nor sources_len'}; "
                "pass format='chat' or format='supervised'"
            )
        ((format, other),) = present.items()
    else:
        other = TokenCache.open(path, MASK_FIELD[format])
    field = MASK_FIELD[format]
    lengths = tokens.doc_lengths().astype(np.int64)
    offsets = np.asarray(tokens.doc_offsets(), np.int64)
    if lengths.size == 0:
        raise PackedDataError(f"the {format} cache at {path} holds no examples")
    if (lengths == 0).any():
        row = _first(lengths == 0)
        raise PackedDataError(
            f"{format} cache {path}: row {row} is an empty example (input_ids has 0 tokens)"
        )
    if other.num_rows != tokens.num_rows:
        raise PackedDataError(
            f"{format} cache {path}: {field} has {other.num_rows} rows but input_ids has {tokens.num_rows}"
        )
    other_lengths = other.doc_lengths()
    if format == "chat":
        bad = other_lengths != lengths
        if bad.any():
            row = _first(bad)
            raise PackedDataError(
                f"chat cache {path}: row {row} has {int(other_lengths[row])} assistant_masks for "
                f"{int(lengths[row])} input_ids tokens (the mask must cover every token)"
            )
        _check_mask_values(other, offsets, path)
        return Examples(format, tokens, other, offsets, lengths, None)
    bad = other_lengths != 1
    if bad.any():
        row = _first(bad)
        raise PackedDataError(
            f"supervised cache {path}: row {row} of sources_len holds {int(other_lengths[row])} values, "
            "not one"
        )
    values = np.asarray(other.read_runs(np.zeros(1, np.int64), np.array([other.num_tokens])).buffer)
    values = values.astype(np.int64)
    if (values < 0).any():
        row = _first(values < 0)
        raise PackedDataError(
            f"supervised cache {path}: row {row} has sources_len={int(values[row])}, a negative prompt length"
        )
    bad = values > lengths
    if bad.any():
        row = _first(bad)
        raise PackedDataError(
            f"supervised cache {path}: row {row} has sources_len={int(values[row])}, past its example of "
            f"{int(lengths[row])} tokens"
        )
    logger.info("opened the %s cache at %s: %d examples, %d tokens", format, path, lengths.size, offsets[-1])
    return Examples(format, tokens, None, offsets, lengths, values.astype(np.int32))
