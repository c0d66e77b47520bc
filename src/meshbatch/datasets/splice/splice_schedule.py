"""Splice schedules from document lengths: placements, per-document quotas, the epoch shuffle.

``splice_schedule(lengths, key=..., **spec)`` is the research object (``len()`` rows per epoch and
a jitted ``lookup(rows, epoch) -> (doc, t, s, copy_len)``); splice datasets build the same
schedule from their pipeline's key. Quotas follow ``balance_mode``: ``by_coverage`` gives each
document its distinct pairs, ``by_document`` equal rows, ``by_temperature`` rows ``∝ L^tau``,
rounded by largest remainder to ``epoch_length`` rows when it is set:

    lengths = [7, 5, 3], seq_len = 8, content_length = 4, coverage_balanced:
    items = [4, 2, 0]; by_coverage -> quotas [4, 2, 0]; by_document -> [4, 4, 0] (8 rows)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key
from meshbatch.kernels.internal import LanePermutation, SpliceSchedule
from meshbatch.shuffles.shuffle_spec import permutation

from .splice_spec import MAX_ROWS, SpliceSpec, check_lengths
from .tables import balanced_placement, bit_length, largest_remainder, pair_placement

logger = logging.getLogger(__name__)

_KEY_TAGS = {"rows": 0, "content": 1, "offsets": 2, "jitter": 3}


def subkey(key: PRNGKeyArray, purpose: str) -> PRNGKeyArray:
    """An independent key per purpose: row shuffle, start shuffle, placement shuffle, jitter."""
    return jax.random.fold_in(key, _KEY_TAGS[purpose])


def axis_permutation(spec: SpliceSpec, key: PRNGKeyArray | None, axis: str) -> LanePermutation | None:
    """The shuffle of the ``"content"`` or ``"offsets"`` axis: keyed by the axis's own seed
    (``content_seed``/``offset_seed``) when it has one, else by the schedule's key."""
    shuffle = spec.axis_shuffle(axis)
    if shuffle is None:
        return None
    window, seed = shuffle
    return LanePermutation(subkey(key if seed is None else jax.random.key(seed), axis), window=window)


def schedule_key(spec: SpliceSpec, key) -> PRNGKeyArray | None:
    """The checked key of a research-object schedule: required exactly when the spec draws one."""
    if key is None:
        if spec.needs_key:
            raise ValueError(
                "key=None, but a shuffle or jitter_mode='uniform' with offset_jitter > 0 needs one"
            )
        return None
    return as_key(key)


def splice_schedule(doc_lengths: Sequence[int] | np.ndarray, *, key=None, **spec) -> SpliceSchedule:
    """The device schedule of a splice dataset over documents of the given lengths.

    Args:
        doc_lengths: length of every document (e.g. ``TokenCache.doc_lengths()`` of a selection).
        key: the key of the spec's shuffles and uniform jitter (a typed key or an int seed);
            required when the spec uses one.
        **spec: ``SpliceSpec`` fields (``seq_len``, ``content_length``, ``content_start_mode``, ...).

    Returns:
        A ``SpliceSchedule``: ``len()`` rows per epoch and a jitted ``lookup(rows, epoch) -> (doc,
        t, s, copy_len)``. With no shuffle, row ``i`` is the ``i``-th pair in the seed's default
        order (document, then ``t`` ascending, then ``s`` ascending).

    Raises:
        TypeError, ValueError: naming the bad value, for an invalid spec or key, no usable
            document, or an epoch of ``2^32`` rows or more.
    """
    spec = SpliceSpec(**spec)
    return build_schedule(check_lengths(doc_lengths), spec, schedule_key(spec, key))


def build_schedule(
    lengths: np.ndarray, spec: SpliceSpec, key: PRNGKeyArray | None, *, log_summary: bool = True
) -> SpliceSchedule:
    """``splice_schedule`` for checked int64 lengths, a built spec and a checked key (or ``None``
    when the spec draws nothing)."""
    placement, items = _placement(lengths, spec, key, keyed=True, log_summary=log_summary)
    quotas = _quotas(spec, lengths, items)
    if log_summary:
        _log_summary(spec, lengths, quotas, items)
    total = int(quotas.sum())
    shuffle = permutation("feistel", total, subkey(key, "rows")) if spec.shuffle_per_epoch else None
    return SpliceSchedule(
        cum_rows=jnp.asarray(np.concatenate([[0], np.cumsum(quotas)]), dtype=jnp.uint32),
        items=jnp.asarray(items, dtype=jnp.uint32),
        placement=placement,
        shuffle=shuffle,
        doc_steps=bit_length(lengths.shape[0]),
    )


def epoch_rows(lengths: np.ndarray, spec: SpliceSpec) -> int:
    """Rows per epoch of ``build_schedule(lengths, spec, key)`` for every key, without one: the
    counts of pairs and the quotas never depend on the shuffles or the jitter.

    Raises:
        ValueError: as ``build_schedule`` (no usable document, an epoch of ``2^32`` rows or more).
    """
    _, items = _placement(lengths, spec, None, keyed=False, log_summary=False)
    return int(_quotas(spec, lengths, items).sum())


def _placement(lengths, spec: SpliceSpec, key: PRNGKeyArray | None, *, keyed: bool, log_summary: bool):
    """``(placement, items)``; ``keyed=False`` leaves out everything keyed (lane shuffles, the
    uniform jitter key): only ``items`` is then meant to be used."""
    if spec.content_start_mode == "coverage_balanced":
        uniform_jitter = spec.offset_jitter > 0 and spec.jitter_mode == "uniform" and keyed
        placement, items = balanced_placement(
            lengths,
            seq_len=spec.seq_len,
            content_length=spec.content_length,
            content_stride=spec.content_stride,
            min_copy_len=spec.min_copy_len,
            alpha=float(spec.alpha),
            adaptive_k=spec.adaptive_k,
            offset_jitter=spec.offset_jitter,
            jitter_mode=spec.jitter_mode,
            jitter_key=subkey(key, "jitter") if uniform_jitter else None,
        )
        short = int(((np.asarray(placement.jitter) <= spec.offset_jitter) & (items > 0)).sum())
        if spec.offset_jitter and short and log_summary:
            logger.warning(
                "offset_jitter=%d: %d documents have seq_len - K_i < offset_jitter and get fewer "
                "placements (s stays >= 0)", spec.offset_jitter, short,
            )  # fmt: skip
    else:
        slide = spec.mode == "slide"
        placement, items = pair_placement(
            lengths,
            start_mode="slide" if slide else spec.content_start_mode,
            seq_len=spec.seq_len,
            content_length=spec.content_length,
            content_stride=spec.window_stride if slide else spec.content_stride,
            offset_stride=spec.offset_stride,
            min_copy_len=spec.min_copy_len,
            content_perm=axis_permutation(spec, key, "content") if keyed else None,
            offset_perm=axis_permutation(spec, key, "offsets") if keyed else None,
        )
    return placement, items


def _quotas(spec: SpliceSpec, lengths: np.ndarray, items: np.ndarray) -> np.ndarray:
    if not (items > 0).any():
        raise _no_pairs_error(spec, lengths)
    if int(items.max()) > MAX_ROWS:
        doc = int(items.argmax())
        raise ValueError(f"document {doc} (length {lengths[doc]}) has {int(items.max())} pairs, >= 2^32")
    return quotas_of(spec, lengths, items)


def quotas_of(spec: SpliceSpec, lengths: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Rows per document: the balance mode's weights, largest remainder over ``epoch_length``."""
    valid = items > 0
    if spec.balance_mode == "by_coverage":
        weights, default = items.astype(np.float64), int(items.sum())
    elif spec.balance_mode == "by_document":  # equal rows per document, no replicated list
        weights, default = valid.astype(np.float64), int(valid.sum()) * int(items.max())
    else:  # by_temperature: P(doc) ∝ L^tau
        with np.errstate(over="ignore"):
            weights = np.where(valid, lengths.astype(np.float64) ** spec.balance_tau, 0.0)
        if not np.isfinite(weights.sum()):
            raise ValueError(
                f"balance_tau={spec.balance_tau} overflows the weights of {int(lengths.max())}-token "
                "documents (length ** balance_tau); use a smaller balance_tau"
            )
        default = int(items.sum())
    total = default if spec.epoch_length is None else spec.epoch_length
    if total > MAX_ROWS:
        raise ValueError(
            f"an epoch of {total} rows does not fit uint32 row indices (< 2^32); raise "
            "content_stride/offset_stride or set epoch_length"
        )
    if spec.balance_mode == "by_coverage" and spec.epoch_length is None:
        return items.copy()
    return largest_remainder(weights, total)


def _fmt(values: np.ndarray, limit: int = 16) -> str:
    shown = ", ".join(str(v) for v in np.asarray(values)[:limit].tolist())
    more = f", ... ({values.shape[0]} values)" if values.shape[0] > limit else ""
    return f"[{shown}{more}]"


def _log_summary(spec: SpliceSpec, lengths: np.ndarray, quotas: np.ndarray, items: np.ndarray) -> None:
    tag = "[multi_splice]" if lengths.shape[0] > 1 else "[splice]"
    mode = "slide" if spec.mode == "slide" else spec.content_start_mode
    logger.info(
        "%s num_docs=%d doc_lengths=%s\n               Pos.size=%d content_length=%s mode=%s\n"
        "               balance_mode=%s total_pairs=%d",
        tag, lengths.shape[0], _fmt(lengths), spec.seq_len, spec.content_length, mode,
        spec.balance_mode, int(quotas.sum()),
    )  # fmt: skip
    logger.info("%s pairs_per_doc=%s", tag, _fmt(quotas))
    logger.info("%s distinct_pairs_per_doc=%s", tag, _fmt(items))
    if spec.balance_mode == "by_temperature":
        logger.info("%s doc_probs ~ length^%g normalized", tag, spec.balance_tau)
        logger.info("%s expected_doc_fraction=%s", tag, _fmt(np.round(quotas / quotas.sum(), 4)))
    if (items == 0).any():
        logger.info("%s %d documents yield no pair and are skipped", tag, int((items == 0).sum()))


def _no_pairs_error(spec: SpliceSpec, lengths: np.ndarray) -> ValueError:
    if spec.mode == "slide":
        what = f"seq_len={spec.seq_len} (mode='slide')"
    elif spec.content_start_mode == "coverage_balanced" and not spec.adaptive_k:
        what = f"content_length={min(spec.content_length or spec.seq_len, spec.seq_len)} (adaptive_k=False)"
    else:
        what = f"min_copy_len={spec.min_copy_len}"
    return ValueError(
        f"no document yields a splice pair: doc_lengths={_fmt(lengths)} are all shorter than {what}"
    )
