"""Choose which cached documents a splice dataset trains on, from their lengths alone.

Lengths come from a token cache's offsets (``TokenCache.doc_lengths()``); no token is read. The
seed's rules, in order:

1. Hard filters: ``restrict_to_training_subset`` keeps documents that lie wholly inside the first
   ``max_train_batches * initial_batch_size * seq_len`` cache tokens; ``doc_key`` keeps documents
   whose key matches (a string, or a predicate on the key).
2. Length thresholds ``min_doc_length <= L <= max_doc_length`` give the candidates.
3. ``doc_index``, when it is a candidate, is the selection. Otherwise the policy
   (``doc_select_mode``: first | longest | shortest | random) picks ``num_docs`` candidates.
4. No candidate at all: the longest documents that pass the hard filters.

    lengths = [5, 40, 12, 40, 7], min_doc_length = 10, doc_select_mode = "longest", num_docs = 2
    candidates = [1, 2, 3] -> longest (ties by index) -> indices = [1, 3]
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Callable, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key, check_bool, check_choice, check_int, check_optional_int
from meshbatch.shuffles.shuffle_spec import permutation

logger = logging.getLogger(__name__)

SelectMode = Literal["first", "longest", "shortest", "random"]


@dataclasses.dataclass(frozen=True)
class DocumentSelection:
    """Selected documents.

    Attributes:
        indices: int64 cache indices, in selection order.
        lengths: int64 lengths of those documents.
        reason: how they were chosen (policy, ``doc_index`` honoured, or which fallback).
    """

    indices: np.ndarray
    lengths: np.ndarray
    reason: str


def _training_subset(lengths: np.ndarray, max_train_batches, initial_batch_size, seq_len) -> np.ndarray:
    for name, value in (
        ("max_train_batches", max_train_batches),
        ("initial_batch_size", initial_batch_size),
        ("seq_len", seq_len),
    ):
        if value is None:
            raise ValueError(
                f"restrict_to_training_subset=True needs a positive int {name} (got {name}=None)"
            )
        check_int(name, value, low=1)
    cutoff = int(max_train_batches) * int(initial_batch_size) * int(seq_len)
    return np.cumsum(lengths) <= cutoff  # document end inside the trained prefix


def _key_matches(doc_key, doc_keys, num_docs: int) -> np.ndarray:
    if doc_keys is None:
        raise ValueError(f"doc_key={doc_key!r} needs doc_keys (one key per document)")
    if len(doc_keys) != num_docs:
        raise ValueError(f"doc_keys has {len(doc_keys)} entries but doc_lengths has {num_docs}")
    predicate = doc_key if callable(doc_key) else (lambda k: k == doc_key)
    matches = np.fromiter((bool(predicate(k)) for k in doc_keys), dtype=bool, count=num_docs)
    if not matches.any():
        raise ValueError(f"doc_key={doc_key!r} matches no document")
    return matches


def _pick(mode: SelectMode, candidates: np.ndarray, lengths: np.ndarray, num_docs: int, key) -> np.ndarray:
    if mode == "first":
        return candidates[:num_docs]
    if mode in ("longest", "shortest"):
        sign = -1 if mode == "longest" else 1
        return candidates[np.lexsort((candidates, sign * lengths[candidates]))][:num_docs]
    # Seeded by the dataset (its lengths) and num_docs, so the same data gives the same picks.
    fingerprint = zlib.crc32(np.ascontiguousarray(lengths, dtype="<i8").tobytes())
    base = jax.random.key(0) if key is None else as_key(key)
    key = jax.random.fold_in(jax.random.fold_in(base, fingerprint), num_docs)
    take = min(num_docs, candidates.shape[0])
    order = permutation("feistel", int(candidates.shape[0]), key)(jnp.arange(take, dtype=jnp.uint32))
    return candidates[np.asarray(order).astype(np.int64)]


def select_documents(
    doc_lengths: Sequence[int] | np.ndarray,
    *,
    num_docs: int = 1,
    doc_index: int | None = None,
    doc_key: str | Callable[[str], bool] | None = None,
    doc_keys: Sequence[str] | None = None,
    min_doc_length: int | None = None,
    max_doc_length: int | None = None,
    doc_select_mode: SelectMode = "longest",
    key: PRNGKeyArray | None = None,
    restrict_to_training_subset: bool = False,
    max_train_batches: int | None = None,
    initial_batch_size: int | None = None,
    seq_len: int | None = None,
) -> DocumentSelection:
    """Select ``num_docs`` documents by the seed's rules (module docstring); host, O(num_docs_in_cache).

    ``doc_lengths`` are every cached document's, in cache order; ``doc_index`` selects exactly one
    document, honoured when it passes every filter; ``doc_keys`` holds one key per document for
    ``doc_key``; the length thresholds are inclusive. ``random`` is seeded by the lengths,
    ``num_docs`` and ``key`` (default ``jax.random.key(0)``), so it is reproducible. The returned
    ``reason`` says which rule chose the documents (also logged).

    Raises:
        ValueError: naming the value, for an out-of-range ``doc_index``, unknown mode, bad
            thresholds, a ``doc_key`` that matches nothing, or when the hard filters leave nothing.
    """
    lengths = np.asarray(doc_lengths)
    if lengths.ndim != 1 or lengths.shape[0] == 0 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"doc_lengths must be a non-empty 1-D int array (got shape={lengths.shape})")
    lengths = lengths.astype(np.int64)
    total = lengths.shape[0]
    check_choice("doc_select_mode", doc_select_mode, SelectMode)
    num_docs = check_int("num_docs", num_docs, low=1, high=2**32 - 1)  # a key is folded with it
    check_bool("restrict_to_training_subset", restrict_to_training_subset)
    if doc_index is not None:
        doc_index = check_int("doc_index", doc_index)
        if not 0 <= doc_index < total:
            raise ValueError(f"doc_index={doc_index} is out of range for {total} documents")
        if num_docs != 1:
            raise ValueError(f"doc_index selects one document (got num_docs={num_docs})")
    min_doc_length = check_optional_int("min_doc_length", min_doc_length, low=0)
    max_doc_length = check_optional_int("max_doc_length", max_doc_length, low=0)
    low = 0 if min_doc_length is None else min_doc_length
    high = np.iinfo(np.int64).max if max_doc_length is None else max_doc_length
    if low > high:
        raise ValueError(f"min_doc_length={min_doc_length} > max_doc_length={max_doc_length}")

    allowed = np.ones(total, dtype=bool)
    if restrict_to_training_subset:
        allowed &= _training_subset(lengths, max_train_batches, initial_batch_size, seq_len)
    if doc_key is not None:
        allowed &= _key_matches(doc_key, doc_keys, total)
    if not allowed.any():
        raise ValueError(f"no document passes restrict_to_training_subset/doc_key={doc_key!r}")
    fits = allowed & (lengths >= low) & (lengths <= high)
    candidates = np.flatnonzero(fits)

    if doc_index is not None and fits[doc_index]:
        chosen, reason = np.array([doc_index]), f"doc_index={doc_index} honoured"
    else:
        reason = f"doc_select_mode={doc_select_mode!r} over {candidates.shape[0]} candidates"
        if doc_index is not None:
            why = (
                "is outside the training subset or doc_key"
                if not allowed[doc_index]
                else "violates the length thresholds"
            )
            reason = f"doc_index={doc_index} (length {lengths[doc_index]}) {why}; fell back to {reason}"
        if candidates.shape[0] == 0:
            pool = np.flatnonzero(allowed)
            chosen = pool[np.lexsort((pool, -lengths[pool]))][:num_docs]
            reason = f"no document has {low} <= length <= {max_doc_length}; fell back to the longest overall"
        else:
            chosen = _pick(doc_select_mode, candidates, lengths, num_docs, key)
    if chosen.shape[0] < num_docs:
        logger.warning("num_docs=%d but only %d documents qualify (%s)", num_docs, chosen.shape[0], reason)
    logger.info("[multi_splice] %s", reason)
    for doc in chosen[:16].tolist():
        logger.info("[multi_splice] Selected doc_idx=%d, length=%d", doc, lengths[doc])
    return DocumentSelection(indices=chosen.astype(np.int64), lengths=lengths[chosen], reason=reason)
