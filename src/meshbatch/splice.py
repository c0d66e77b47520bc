"""Splice document datasets: documents spliced at many offsets ``s`` and in-document starts ``t``.

``splice_schedule(doc_lengths, **spec)`` checks a spec (the seed's parameter names) and builds the
device schedule; ``SpliceDataset(docs, **spec)`` adds a device-resident document pool and builds a
batch in one jitted call; ``splice_batch(docs, indices, **spec)`` is the one-shot form.

    docs = [[0, 1, 2, 3, 4]], seq_len = 5, content_length = 3, content_start_mode = "slide_within"
    len(schedule) = 13         # (t, s) = (0,0) (0,1) (0,2) (1,0) ... (3,0) (3,1) (3,2) (3,3)
    splice_batch(docs, [9], pad_token_id=P, ...).tokens == [[3, 4, P, P, P]]
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from functools import partial
from typing import Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.kernels.batch import Batch
from meshbatch.kernels.splice import DocumentPool, SegmentMode, pool_frames
from meshbatch.kernels.splice_balanced import BalancedPlacement, JitterMode
from meshbatch.kernels.splice_pairs import PairPlacement
from meshbatch.kernels.splice_schedule import (
    LanePermutation,
    SpliceSchedule,
    bit_length,
    largest_remainder,
    lookup_rows,
)
from meshbatch.shuffle import permutation

logger = logging.getLogger(__name__)

Mode = Literal["splice", "slide"]
ContentStartMode = Literal["anchor_start", "slide_within", "cyclic_roll", "coverage_balanced"]
BalanceMode = Literal["by_coverage", "by_document", "by_temperature"]
MAX_ROWS = 2**32 - 1
_KEY_TAGS = {"rows": 0, "content": 1, "offsets": 2, "jitter": 3}


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int (got {name}={value!r})")
    if value < low:
        raise ValueError(f"{name}={value} must be >= {low}")


def _check_choice(name: str, value, choices: type) -> None:
    if value not in get_args(choices):
        raise ValueError(f"{name}={value!r} is not one of {get_args(choices)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpliceSpec:
    """A splice dataset's configuration, checked at construction; names follow the seed.

    See ``docs/splice.md`` for every field. ``content_length=None`` copies as many tokens as fit;
    ``window_stride`` (the seed's ``k_window``) is the window step of ``mode="slide"``.
    """

    seq_len: int
    content_length: int | None = None
    content_stride: int = 1
    offset_stride: int = 1
    window_stride: int = 1
    content_start_mode: ContentStartMode = "anchor_start"
    mode: Mode = "splice"
    min_copy_len: int = 2
    alpha: float = 0.0
    adaptive_k: bool = True
    offset_jitter: int = 0
    jitter_mode: JitterMode = "uniform"
    balance_mode: BalanceMode = "by_coverage"
    balance_tau: float = 1.0
    epoch_length: int | None = None
    shuffle_per_epoch: bool = False
    shuffle_content: bool = False
    shuffle_offsets: bool = False
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    segment_mode: SegmentMode = "prefix"
    key: PRNGKeyArray | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        _check_int("seq_len", self.seq_len, 1)
        if self.content_length is not None:
            _check_int("content_length", self.content_length, 2)
        for name in ("content_stride", "offset_stride", "window_stride"):
            _check_int(name, getattr(self, name), 1)
        _check_int("min_copy_len", self.min_copy_len, 2)
        _check_int("offset_jitter", self.offset_jitter, 0)
        if self.epoch_length is not None:
            _check_int("epoch_length", self.epoch_length, 1)
        for name, choices in (
            ("mode", Mode),
            ("content_start_mode", ContentStartMode),
            ("balance_mode", BalanceMode),
            ("jitter_mode", JitterMode),
            ("segment_mode", SegmentMode),
        ):
            _check_choice(name, getattr(self, name), choices)
        for name in ("alpha", "balance_tau"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} must be a finite number >= 0")
        for name in ("pad_token_id", "eos_token_id"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), -(2**31))
        if self.content_length is not None and self.content_length < self.min_copy_len:
            raise ValueError(
                f"content_length={self.content_length} < min_copy_len={self.min_copy_len}: "
                "no copy is long enough"
            )
        if self.seq_len < self.min_copy_len:
            raise ValueError(
                f"seq_len={self.seq_len} < min_copy_len={self.min_copy_len}: no frame holds a copy"
            )
        self._check_mode_fields()
        if self.needs_key and self.key is None:
            raise ValueError(
                "key=None, but a shuffle or jitter_mode='uniform' with offset_jitter > 0 needs one"
            )

    def _check_mode_fields(self) -> None:
        """Fields that the chosen mode would silently ignore are errors."""
        balanced = self.content_start_mode == "coverage_balanced"
        only = {
            "window_stride": (self.window_stride != 1, "mode='slide'", self.mode == "slide"),
            "content_length": (self.content_length is not None, "mode='splice'", self.mode == "splice"),
            "content_stride": (
                self.content_stride != 1,
                "content_start_mode in ('slide_within', 'cyclic_roll', 'coverage_balanced')",
                self.mode == "splice" and self.content_start_mode != "anchor_start",
            ),
            "offset_stride": (self.offset_stride != 1, "enumerated splice modes", self.enumerated),
            "alpha": (self.alpha != 0, "content_start_mode='coverage_balanced'", balanced),
            "offset_jitter": (self.offset_jitter != 0, "content_start_mode='coverage_balanced'", balanced),
            "adaptive_k": (not self.adaptive_k, "content_start_mode='coverage_balanced'", balanced),
            "shuffle_content": (self.shuffle_content, "enumerated modes", not balanced),
            "shuffle_offsets": (self.shuffle_offsets, "enumerated splice modes", self.enumerated),
        }
        for name, (is_set, where, applies) in only.items():
            if is_set and not applies:
                raise ValueError(f"{name}={getattr(self, name)!r} only applies to {where}")
        if self.mode == "slide" and self.content_start_mode != "anchor_start":
            raise ValueError(f"content_start_mode={self.content_start_mode!r} does not apply to mode='slide'")
        if balanced and self.mode == "slide":
            raise ValueError("content_start_mode='coverage_balanced' does not apply to mode='slide'")

    @property
    def enumerated(self) -> bool:
        return self.mode == "splice" and self.content_start_mode != "coverage_balanced"

    @property
    def needs_key(self) -> bool:
        jitter = self.offset_jitter > 0 and self.jitter_mode == "uniform"
        return self.shuffle_per_epoch or self.shuffle_content or self.shuffle_offsets or jitter

    def subkey(self, purpose: str) -> PRNGKeyArray:
        """An independent typed key per purpose: row shuffle, start shuffle, placement shuffle, jitter."""
        key = self.key
        if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.wrap_key_data(key)  # a raw uint32[2] PRNGKey
        return jax.random.fold_in(key, _KEY_TAGS[purpose])


def _check_lengths(doc_lengths) -> np.ndarray:
    lengths = np.asarray(doc_lengths)
    if lengths.ndim != 1 or lengths.shape[0] == 0:
        raise ValueError(f"doc_lengths must be a non-empty 1-D array (got shape={lengths.shape})")
    if not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"doc_lengths must be integers (got dtype={lengths.dtype})")
    if lengths.min() < 0 or lengths.max() >= 2**31:
        raise ValueError(f"doc_lengths must lie in [0, 2^31) (got min={lengths.min()}, max={lengths.max()})")
    return lengths.astype(np.int64)


def _fmt(values: np.ndarray, limit: int = 16) -> str:
    shown = ", ".join(str(v) for v in np.asarray(values)[:limit].tolist())
    more = f", ... ({values.shape[0]} values)" if values.shape[0] > limit else ""
    return f"[{shown}{more}]"


def _quotas(spec: SpliceSpec, lengths: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Rows per document: the balance mode's weights, largest remainder over ``epoch_length``."""
    valid = items > 0
    if spec.balance_mode == "by_coverage":
        weights, default = items.astype(np.float64), int(items.sum())
    elif spec.balance_mode == "by_document":  # equal rows per document, no replicated list
        weights, default = valid.astype(np.float64), int(valid.sum()) * int(items.max())
    else:  # by_temperature: P(doc) ∝ L^tau
        weights = np.where(valid, lengths.astype(np.float64) ** spec.balance_tau, 0.0)
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


def splice_schedule(doc_lengths: Sequence[int] | np.ndarray, **spec) -> SpliceSchedule:
    """The device schedule of a splice dataset over documents of the given lengths.

    Args:
        doc_lengths: length of every document (e.g. ``TokenCache.doc_lengths()`` of a selection).
        **spec: ``SpliceSpec`` fields (``seq_len``, ``content_length``, ``content_start_mode``, ...).

    Returns:
        A ``SpliceSchedule``: ``len()`` rows per epoch and a jitted ``lookup(rows, epoch) -> (doc,
        t, s, copy_len)``. With no shuffle, row ``i`` is the ``i``-th pair in the seed's default
        order (document, then ``t`` ascending, then ``s`` ascending).

    Raises:
        ValueError: naming the bad value, for an invalid spec, no usable document, or an epoch of
            ``2^32`` rows or more.
    """
    return build_schedule(_check_lengths(doc_lengths), SpliceSpec(**spec))


def build_schedule(lengths: np.ndarray, spec: SpliceSpec, *, log_summary: bool = True) -> SpliceSchedule:
    """``splice_schedule`` for checked int64 lengths and a built ``SpliceSpec``."""
    if spec.content_start_mode == "coverage_balanced":
        uniform_jitter = spec.offset_jitter > 0 and spec.jitter_mode == "uniform"
        placement, items = BalancedPlacement.build(
            lengths,
            seq_len=spec.seq_len,
            content_length=spec.content_length,
            content_stride=spec.content_stride,
            min_copy_len=spec.min_copy_len,
            alpha=float(spec.alpha),
            adaptive_k=spec.adaptive_k,
            offset_jitter=spec.offset_jitter,
            jitter_mode=spec.jitter_mode,
            jitter_key=spec.subkey("jitter") if uniform_jitter else None,
        )
        short = int(((np.asarray(placement.jitter) <= spec.offset_jitter) & (items > 0)).sum())
        if spec.offset_jitter and short:
            logger.warning(
                "offset_jitter=%d: %d documents have seq_len - K_i < offset_jitter and get fewer "
                "placements (s stays >= 0)", spec.offset_jitter, short,
            )  # fmt: skip
    else:
        slide = spec.mode == "slide"
        placement, items = PairPlacement.build(
            lengths,
            start_mode="slide" if slide else spec.content_start_mode,
            seq_len=spec.seq_len,
            content_length=spec.content_length,
            content_stride=spec.window_stride if slide else spec.content_stride,
            offset_stride=spec.offset_stride,
            min_copy_len=spec.min_copy_len,
            content_perm=LanePermutation(spec.subkey("content")) if spec.shuffle_content else None,
            offset_perm=LanePermutation(spec.subkey("offsets")) if spec.shuffle_offsets else None,
        )
    if not (items > 0).any():
        raise _no_pairs_error(spec, lengths)
    if int(items.max()) > MAX_ROWS:
        doc = int(items.argmax())
        raise ValueError(f"document {doc} (length {lengths[doc]}) has {int(items.max())} pairs, >= 2^32")
    quotas = _quotas(spec, lengths, items)
    if log_summary:
        _log_summary(spec, lengths, quotas, items)
    total = int(quotas.sum())
    shuffle = None
    if spec.shuffle_per_epoch:
        shuffle = permutation("feistel", total, spec.subkey("rows"))
    return SpliceSchedule(
        cum_rows=jnp.asarray(np.concatenate([[0], np.cumsum(quotas)]), dtype=jnp.uint32),
        items=jnp.asarray(items, dtype=jnp.uint32),
        placement=placement,
        shuffle=shuffle,
        doc_steps=bit_length(lengths.shape[0]),
    )


def split_indices(indices, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Global example indices → ``(epoch, row)`` (int64), checking range."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer) or idx.size == 0:
        raise ValueError(
            f"indices must be a non-empty 1-D integer array (got shape={idx.shape}, {idx.dtype})"
        )
    if idx.min() < 0:
        raise ValueError(f"indices must be >= 0 (got {int(idx.min())})")
    epoch, row = np.divmod(idx.astype(np.int64), num_rows)
    if epoch.max() >= 2**32:
        raise ValueError(f"index {int(idx.max())} lies past epoch 2^32 - 1")
    return epoch, row


def shard_indices(local_indices, *, process_index: int, process_count: int) -> np.ndarray:
    """This process's global example indices: ``local * process_count + process_index``.

    The seed's leapfrog sharding: process ``p`` of ``P`` owns every index ``n`` with
    ``n % P == p``, so processes never duplicate a pair and together cover every one.
    """
    _check_int("process_count", process_count, 1)
    _check_int("process_index", process_index, 0)
    if process_index >= process_count:
        raise ValueError(f"process_index={process_index} must be < process_count={process_count}")
    return np.asarray(local_indices, dtype=np.int64) * process_count + process_index


@partial(jax.jit, static_argnames=("seq_len", "pad_token_id", "eos_token_id", "segment_mode", "cyclic"))
def _frames(schedule, pool, rows, epoch, **static):
    doc, t, s, copy_len = lookup_rows(schedule, rows, epoch)
    return pool_frames(pool, doc, t, s, copy_len, **static)


@jax.jit
def _select_rows(take, new: Batch, old: Batch) -> Batch:
    return jax.tree.map(lambda a, b: jnp.where(take.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)


class SpliceDataset:
    """In-memory documents as a splice dataset: device pool + schedule, one jitted call per batch.

    Args:
        docs: 1-D integer token arrays.
        **spec: ``SpliceSpec`` fields; ``pad_token_id`` is required.
    """

    def __init__(self, docs: Sequence[np.ndarray], **spec):
        self.spec = SpliceSpec(**spec)
        if self.spec.pad_token_id is None:
            raise ValueError("pad_token_id is required to build frames (got pad_token_id=None)")
        self.pool = DocumentPool.from_documents(docs, margin=self.spec.seq_len)  # no per-call pad
        self.schedule = build_schedule(_check_lengths([len(d) for d in docs]), self.spec)
        self.frame_args = dict(
            seq_len=self.spec.seq_len,
            pad_token_id=self.spec.pad_token_id,
            eos_token_id=self.spec.eos_token_id,
            segment_mode=self.spec.segment_mode,
            cyclic=self.schedule.placement.cyclic,
        )

    def __len__(self) -> int:
        return len(self.schedule)

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """Frames for global example indices (``epoch = index // len(self)``): ``int32[n, seq_len]``."""
        epoch, row = split_indices(indices, len(self.schedule))
        rows = jnp.asarray(row, dtype=jnp.uint32)
        epochs = np.unique(epoch)  # a batch spans one epoch, or a few at a boundary
        out = _frames(self.schedule, self.pool, rows, jnp.uint32(epochs[0]), **self.frame_args)
        for e in epochs[1:]:
            batch = _frames(self.schedule, self.pool, rows, jnp.uint32(e), **self.frame_args)
            out = _select_rows(jnp.asarray(epoch == e), batch, out)
        return out

    def frames_at(self, doc, t, s) -> Batch:
        """Frames for explicit placements, ``copy_len = min(K, L - t, S - s)`` (the seed's Example
        Construction; ``L`` in place of ``L - t`` for cyclic_roll), outside the schedule.

        Raises:
            ValueError: for a ``doc``, ``t`` or ``s`` outside its range, naming it.
        """
        doc, t, s = (np.atleast_1d(np.asarray(x, dtype=np.int64)) for x in (doc, t, s))
        lengths = np.diff(np.asarray(self.pool.offsets).astype(np.int64))
        for name, value, high in (("doc", doc, lengths.shape[0]), ("s", s, self.spec.seq_len)):
            if value.min() < 0 or value.max() >= high:
                raise ValueError(f"{name}={value.tolist()} must lie in [0, {high})")
        if t.min() < 0 or (t >= lengths[doc]).any():
            raise ValueError(f"t={t.tolist()} must lie in [0, doc length {lengths[doc].tolist()})")
        suffix = lengths[doc] if self.frame_args["cyclic"] else lengths[doc] - t
        copy_len = np.minimum(np.minimum(suffix, self.spec.content_length or suffix), self.spec.seq_len - s)
        as32 = partial(jnp.asarray, dtype=jnp.int32)
        return pool_frames(self.pool, as32(doc), as32(t), as32(s), as32(copy_len), **self.frame_args)


def splice_batch(docs: Sequence[np.ndarray], indices: Sequence[int] | np.ndarray, **spec) -> Batch:
    """Frames ``int32[len(indices), seq_len]`` and ``doc_idx`` for ``indices`` of the splice dataset."""
    return SpliceDataset(docs, **spec).get_batch(indices)


def pairs_per_doc(schedule: SpliceSchedule) -> np.ndarray:
    """Rows each document owns per epoch (int64 ``[num_docs]``)."""
    return np.diff(np.asarray(schedule.cum_rows).astype(np.int64))


def coverage_counts(
    schedule: SpliceSchedule, doc: int, *, epoch: int = 0, chunk: int = 1 << 16
) -> np.ndarray:
    """How often each token of document ``doc`` is copied into a frame in one epoch.

    Host diagnostic, O(rows of ``doc``): walks the document's rows in canonical order (the
    multiset of a document's placements does not depend on the row shuffle).

    Returns:
        int64 ``[doc_length]`` copy counts (a cyclic copy wraps to the document start).
    """
    num_docs = schedule.num_docs
    if not 0 <= doc < num_docs:
        raise ValueError(f"doc={doc} is out of range for num_docs={num_docs}")
    cum = np.asarray(schedule.cum_rows).astype(np.int64)
    length = int(np.asarray(schedule.placement.doc_len)[doc])
    diff = np.zeros(2 * length + 1, dtype=np.int64)
    for start in range(int(cum[doc]), int(cum[doc + 1]), chunk):
        stop = min(start + chunk, int(cum[doc + 1]))
        rows = np.arange(start, stop, dtype=np.uint32)
        _, t, _, copy_len = (np.asarray(x) for x in _canonical(schedule, rows, np.uint32(epoch)))
        np.add.at(diff, t, 1)
        np.add.at(diff, t + copy_len, -1)
    counts = np.cumsum(diff)[: 2 * length]
    return counts[:length] + counts[length:]


_canonical = jax.jit(partial(lookup_rows, shuffled=False))


def validation_rows(schedule: SpliceSchedule, *, starts: int = 3, offsets: int = 3) -> tuple[np.ndarray, ...]:
    """The seed's validation grid: ``(doc, t, s, copy_len)`` int32 arrays, fixed and small.

    Every document with pairs contributes ``starts`` evenly spaced starts (first and last
    included) at ``offsets`` evenly spaced placements each; keys and epochs play no part.
    """
    _check_int("starts", starts, 1)
    _check_int("offsets", offsets, 1)
    items = np.asarray(schedule.items)
    rows = [
        (doc, *row)
        for doc in np.flatnonzero(items > 0).tolist()
        for row in schedule.placement.grid(doc, starts=starts, offsets=offsets)
    ]
    return tuple(np.asarray(column, dtype=np.int32) for column in zip(*rows, strict=True))


def splice_validation_set(docs: Sequence[np.ndarray], *, starts: int = 3, offsets: int = 3, **spec) -> Batch:
    """The seed's validation set: every document at a fixed small grid of ``(t, s)`` (see
    ``validation_rows``), as one batch with ``doc_idx``."""
    dataset = SpliceDataset(docs, **spec)
    doc, t, s, copy_len = validation_rows(dataset.schedule, starts=starts, offsets=offsets)
    return pool_frames(dataset.pool, doc, t, s, copy_len, **dataset.frame_args)
