"""Splice schedules from document lengths: placements, per-document quotas, the epoch shuffle.

``splice_schedule(lengths, key=..., **spec)`` is the research object (``len()`` rows per epoch and
a jitted ``lookup(rows, epoch) -> (doc, t, s, copy_len)``); splice datasets build the same
schedule from their pipeline's key. Quotas follow ``balance_mode``: ``by_coverage`` gives each
document its distinct pairs, ``by_document`` equal rows, ``by_temperature`` rows ``∝ L^tau``,
rounded by largest remainder to ``epoch_length`` rows when it is set:

    lengths = [7, 5, 3], seq_len = 8, content_length = 4, coverage_balanced:
    items = [4, 2, 0]; by_coverage -> quotas [4, 2, 0]; by_document -> [4, 4, 0] (8 rows)

Host diagnostics read a schedule (rows per document, token coverage, the validation grid); none
is part of making a batch:

    schedule over one doc of L = 5, seq_len = 5, content_length = 3, slide_within
    pairs_per_doc(schedule)       -> [13]
    coverage_counts(schedule, 0)  -> [3, 6, 9, 10, 7]  (token 3 is copied by 10 of the 13 rows)
    validation_rows(schedule, starts=2, offsets=2) -> t = [0, 0, 3, 3], s = [0, 2, 0, 3]
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key, check_int
from meshbatch.kernels import lookup_rows
from meshbatch.kernels.internal import BalancedPlacement, LanePermutation, SpliceSchedule, pair_count
from meshbatch.shuffles.shuffle_spec import permutation

from .splice_spec import MAX_ROWS, SpliceSpec, check_lengths
from .tables import balanced_placement, bit_length, largest_remainder, pair_placement, spread

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

    ``key`` (a typed key or an int seed) drives the spec's shuffles and uniform jitter, and is
    required when the spec uses one; ``spec`` takes ``SpliceSpec``'s fields. With no shuffle, row
    ``i`` of the schedule is the ``i``-th pair in the seed's default order (document, then ``t``
    ascending, then ``s`` ascending).

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
    if spec.content_start_mode != "coverage_balanced":
        content_perm = axis_permutation(spec, key, "content") if keyed else None
        offset_perm = axis_permutation(spec, key, "offsets") if keyed else None
        return pair_placement(lengths, spec, content_perm, offset_perm)
    uniform_jitter = spec.offset_jitter > 0 and spec.jitter_mode == "uniform" and keyed
    placement, items = balanced_placement(lengths, spec, subkey(key, "jitter") if uniform_jitter else None)
    short = int(((np.asarray(placement.jitter) <= spec.offset_jitter) & (items > 0)).sum())
    if spec.offset_jitter and short and log_summary:
        logger.warning(
            "offset_jitter=%d: %d documents have seq_len - K_i < offset_jitter and get fewer "
            "placements (s stays >= 0)", spec.offset_jitter, short,
        )  # fmt: skip
    return placement, items


def _quotas(spec: SpliceSpec, lengths: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Rows per document: the balance mode's weights, largest remainder over ``epoch_length``."""
    valid = items > 0
    if not valid.any():
        raise _no_pairs_error(spec, lengths)
    if int(items.max()) > MAX_ROWS:
        doc = int(items.argmax())
        raise ValueError(f"document {doc} (length {lengths[doc]}) has {int(items.max())} pairs, >= 2^32")
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


_canonical = jax.jit(partial(lookup_rows, shuffled=False))


def pairs_per_doc(schedule: SpliceSchedule) -> np.ndarray:
    """Rows each document owns per epoch (int64 ``[num_docs]``)."""
    return np.diff(np.asarray(schedule.cum_rows).astype(np.int64))


def coverage_counts(
    schedule: SpliceSchedule, doc: int, *, epoch: int = 0, chunk: int = 1 << 16
) -> np.ndarray:
    """How often each token of document ``doc`` is copied into a frame in one epoch.

    O(rows of ``doc``): walks the document's rows in canonical order (the multiset of a
    document's placements does not depend on the row shuffle), ``chunk`` rows a call or the
    document's rows rounded up to a power of two, whichever is less: documents of similar row
    counts share one compiled lookup (each compile of it takes seconds on a CPU backend). The
    padding lanes repeat the document's last row and are dropped.

    Returns:
        int64 ``[doc_length]`` copy counts (a cyclic copy wraps to the document start).

    Raises:
        TypeError, ValueError: a ``doc`` out of range or a bad ``epoch``/``chunk``.
    """
    num_docs = schedule.num_docs
    doc = check_int("doc", doc)
    epoch = check_int("epoch", epoch, low=0, high=2**32 - 1)
    chunk = check_int("chunk", chunk, low=1)
    if not 0 <= doc < num_docs:
        raise ValueError(f"doc={doc} is out of range for num_docs={num_docs}")
    cum = np.asarray(schedule.cum_rows).astype(np.int64)
    length = int(np.asarray(schedule.placement.doc_len)[doc])
    first, end = int(cum[doc]), int(cum[doc + 1])
    size = min(chunk, 1 << max(0, (end - first - 1).bit_length()))
    diff = np.zeros(2 * length + 1, dtype=np.int64)
    for start in range(first, end, size):
        rows = np.minimum(np.arange(start, start + size, dtype=np.int64), end - 1).astype(np.uint32)
        looked_up = _canonical(schedule, rows, np.uint32(epoch))
        _, t, _, copy_len = (np.asarray(x)[: end - start] for x in looked_up)
        np.add.at(diff, t, 1)
        np.add.at(diff, t + copy_len, -1)
    counts = np.cumsum(diff)[: 2 * length]
    return counts[:length] + counts[length:]


def placement_grid(placement, doc: int, *, starts: int, offsets: int) -> list[tuple[int, int, int]]:
    """``(t, s, copy_len)`` at ``starts`` spread starts x ``offsets`` spread placements of ``doc``."""
    length = int(np.asarray(placement.doc_len)[doc])
    if isinstance(placement, BalancedPlacement):
        content = int(np.asarray(placement.content)[doc])
        num_starts = (length - content) // placement.t_stride + 1
        jitter = int(np.asarray(placement.jitter)[doc])
        return [
            (k * placement.t_stride, placement.seq_len - content - j, content)
            for k in spread(num_starts, starts)
            for j in spread(jitter, offsets)
        ]
    rows = []
    for k in spread(int(np.asarray(placement.slots)[doc]), starts):
        v = length - k * placement.t_stride
        if placement.layout == "uniform":
            count, copy = int(np.asarray(placement.per_slot)[doc]), int(np.asarray(placement.copy)[doc])
        else:
            count = int(
                pair_count(
                    v,
                    seq_len=placement.seq_len,
                    content_length=placement.content_length,
                    offset_stride=placement.s_stride,
                )
            )
            copy = min(v, placement.content_length, placement.seq_len)
        rows += [(k * placement.t_stride, i * placement.s_stride, copy) for i in spread(count, offsets)]
    return rows


def validation_rows(schedule: SpliceSchedule, *, starts: int = 3, offsets: int = 3) -> tuple[np.ndarray, ...]:
    """The seed's validation grid: ``(doc, t, s, copy_len)`` int32 arrays, fixed and small.

    Every document with pairs contributes ``starts`` evenly spaced starts (first and last
    included) at ``offsets`` evenly spaced placements each; keys and epochs play no part.
    """
    starts = check_int("starts", starts, low=1)
    offsets = check_int("offsets", offsets, low=1)
    items = np.asarray(schedule.items)
    rows = [
        (doc, *row)
        for doc in np.flatnonzero(items > 0).tolist()
        for row in placement_grid(schedule.placement, doc, starts=starts, offsets=offsets)
    ]
    return tuple(np.asarray(column, dtype=np.int32) for column in zip(*rows, strict=True))
