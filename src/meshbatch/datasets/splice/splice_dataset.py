"""Splice datasets on the pipeline: selected documents, placed by a schedule, built per shard.

Two ways to hold the documents, same batches either way:

* pool (default for small selections): the selected documents live on every device; plan and
  build run together in the per-shard kernel and the host only computes row positions;
* fetch: only the cache's offsets stay on the host; each step reads the rows' spans
  (``offsets[doc] + t``, ``copy_len`` tokens), coalesced, and the kernel places them straight
  from the fetched buffer (its ``seq_len`` zero margins stand in for the frame's filler reach).

    cache docs = [d0 .. d99], selected = [7, 42], seq_len = 8, content_length = 4
    row -> (doc=1, t=3, s=4, copy_len=4): span (offsets[42] + 3, 4)
    tokens = [P P P P d42[3] d42[4] d42[5] d42[6]], loss_mask = [0 0 0 0 1 1 1 0]

``make(key)`` makes ``SpliceDevice`` (the schedule for the key, the pool, the frame
configuration); rows per epoch are counted from the document lengths alone (``epoch_rows``), so
the dataset knows its length before it sees a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from meshbatch.arguments import check_bool
from meshbatch.datasets.protocol import Content, Dataset, DeviceDataset, Plan, Rows, Spans, check_cache
from meshbatch.datasets.provenance import RowSources, source_name
from meshbatch.kernels import Batch, lookup_rows, pool_frames, splice_frames
from meshbatch.kernels.internal import DocumentPool, SpliceSchedule

from .splice_schedule import build_schedule, epoch_rows
from .splice_spec import SpliceSpec, check_lengths
from .tables import document_pool

# A selection up to this many tokens is copied to every device (4 bytes a token).
POOL_MAX_TOKENS = 1 << 26


class SplicePlan(eqx.Module):
    """A splice plan's rows: document, content start ``t``, frame offset ``s``, copied tokens."""

    doc: Int[Array, " n"]
    t: Int[Array, " n"]
    s: Int[Array, " n"]
    copy_len: Int[Array, " n"]


class FrameBuild(eqx.Module):
    """The frame build's configuration (static): what ``pool_frames``/``splice_frames`` take."""

    seq_len: int = eqx.field(static=True)
    pad_token_id: int = eqx.field(static=True)
    eos_token_id: int | None = eqx.field(static=True)
    segment_mode: str = eqx.field(static=True)
    cyclic: bool = eqx.field(static=True)
    margin: int = eqx.field(static=True)

    def frame_args(self) -> dict:
        return dict(
            seq_len=self.seq_len,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            segment_mode=self.segment_mode,
        )


class SpliceDevice(DeviceDataset):
    """The device half of ``SpliceLMDataset``: the schedule for a key, the pool (``None`` in
    fetch mode) and the frame build."""

    schedule: SpliceSchedule
    pool: DocumentPool | None
    frame: FrameBuild

    @property
    def seq_len(self) -> int:
        return self.frame.seq_len

    def plan(self, rows: Rows, state=None) -> tuple[Plan, None]:
        """Each row's ``(doc, t, s, copy_len)``; ``example`` is its row of the unshuffled epoch."""
        schedule = self.schedule
        example = rows.position if schedule.shuffle is None else schedule.shuffle(rows.position, rows.epoch)
        doc, t, s, copy_len = lookup_rows(schedule, example, rows.epoch, shuffled=False)
        detail = SplicePlan(doc, t, s, copy_len)
        return Plan(rows=rows, source=jnp.zeros(doc.shape, jnp.int32), example=example, detail=detail), None

    def build(self, plan: Plan, content: Content | None) -> Batch:
        """Frames from the fetched buffer (``content``) or from the device pool."""
        d, frame = plan.detail, self.frame
        if content is None:
            return pool_frames(
                self.pool, d.doc, d.t, d.s, d.copy_len, cyclic=frame.cyclic, **frame.frame_args()
            )
        return splice_frames(
            content.tokens,
            content.offsets[:, 0],
            d.s,
            d.copy_len,
            doc_idx=d.doc,
            margin=frame.margin,
            **frame.frame_args(),
        )

    def real_tokens(self, plan: Plan) -> Int[Array, " n"]:
        """A frame trains on its copied tokens."""
        return plan.detail.copy_len.astype(jnp.int32)


class _CacheDocuments(NamedTuple):
    """``from_cache``'s selection, what ``SpliceLMDataset.__init__`` takes in place of arrays."""

    cache: object
    indices: np.ndarray  # int64: the selected rows
    pool: bool


class SpliceLMDataset(Dataset):
    """A splice dataset (``splice-document-dataset.md``) for ``Pipeline``.

    Build it with ``SpliceLMDataset(docs, **spec)`` from token arrays, or
    ``SpliceLMDataset.from_cache(cache, selection, **spec)`` from a ``TokenCache`` and the
    indices ``select_documents`` chose. ``spec`` takes ``SpliceSpec``'s fields; the pipeline's
    key drives the spec's shuffles and jitter (a splice dataset never holds a key of its own).

    Attributes:
        spec: the checked ``SpliceSpec``.
        seq_len: frame length.
        num_examples: rows per epoch (``len`` of the schedule).
        doc_lengths: int64 lengths of the selected documents (``doc_idx`` indexes them).
        pool: the device pool of the documents, or ``None`` in fetch mode.
        doc_source, doc_rows, doc_starts: provenance: the selected documents are rows
            ``doc_rows`` of ``doc_source`` (``None``: the arrays given), starting at token
            ``doc_starts`` of its flat token space (of the arrays' concatenation).
    """

    spec: SpliceSpec
    frame_args: dict
    pool: DocumentPool | None
    doc_lengths: np.ndarray
    doc_source: object
    doc_rows: np.ndarray
    doc_starts: np.ndarray
    source: object
    seq_len: int
    max_row_tokens: int
    cyclic: bool
    num_examples: int
    spans_per_row: int = 1

    def __init__(self, docs: Sequence[np.ndarray], **spec):
        if isinstance(docs, _CacheDocuments):
            selection = docs
        elif not isinstance(docs, Sequence | np.ndarray) or isinstance(docs, str | bytes):
            raise TypeError(f"docs must be a sequence of token arrays (got docs={docs!r}); or use from_cache")
        elif len(docs) == 0:
            raise ValueError(f"give at least one document (got docs={docs!r}); or use from_cache")
        else:
            selection = None
        if "key" in spec:
            raise TypeError(
                "a splice dataset takes no key: the pipeline's key drives its shuffles and jitter "
                "(Pipeline(..., key=...)); SpliceDataset and splice_schedule take key= directly"
            )
        self.spec = SpliceSpec(**spec)
        self.frame_args = self.spec.frame_args  # refuses pad_token_id=None
        self.source = None
        if selection is not None:  # rows ``indices`` of the cache
            cache, indices = selection.cache, selection.indices
            offsets = cache.doc_offsets()
            self.doc_source, self.doc_rows, self.doc_starts = cache, indices, offsets[indices]
            if selection.pool:
                docs = cache.read_rows(indices)
            else:
                docs, self.source = None, cache
                lengths = np.asarray(offsets[indices + 1] - offsets[indices], np.int64)
        self.pool = None if docs is None else document_pool(docs, margin=self.spec.seq_len)
        self.doc_lengths = check_lengths(lengths if docs is None else [len(d) for d in docs])
        if selection is None:  # provenance of arrays: their concatenation, document d at its start
            self.doc_source, self.doc_rows = None, np.arange(len(self.doc_lengths), dtype=np.int64)
            self.doc_starts = np.concatenate([[0], np.cumsum(self.doc_lengths)[:-1]]).astype(np.int64)
        self.sources = () if self.source is None else (self.source,)
        self.seq_len = self.max_row_tokens = self.content_margin = self.spec.seq_len
        self.cyclic = self.spec.cyclic
        if self.fetches and self.cyclic:
            raise ValueError(
                "content_start_mode='cyclic_roll' reads across the document end; it needs the "
                "documents on device (pool=True)"
            )
        self.num_examples = epoch_rows(self.doc_lengths, self.spec)  # the same for every key

    @classmethod
    def from_cache(cls, cache, indices, *, pool: bool | None = None, **spec) -> SpliceLMDataset:
        """Documents ``indices`` of ``cache`` (an opened ``TokenCache``); ``pool=None`` pools
        selections of at most ``POOL_MAX_TOKENS`` tokens and fetches larger ones.

        Raises:
            TypeError: ``cache`` is not an opened cache (a path: open it with ``TokenCache.open``),
                or the indices are not integers.
            ValueError: no indices, or one out of the cache's range.
        """
        check_cache("cache", cache, ("num_rows", "doc_offsets", "read_rows"), "an opened TokenCache")
        if pool is not None:
            check_bool("pool", pool)
        indices = np.asarray(indices).reshape(-1)
        if indices.size == 0:
            raise ValueError("select at least one document (got no indices)")
        if not np.issubdtype(indices.dtype, np.integer):
            raise TypeError(f"document indices must be integers (got dtype={indices.dtype})")
        indices = indices.astype(np.int64)
        bad = indices[(indices < 0) | (indices >= cache.num_rows)]
        if bad.size:
            raise ValueError(
                f"document index {int(bad[0])} out of range for a cache of {cache.num_rows} rows"
            )
        if pool is None:
            offsets = cache.doc_offsets()
            pool = int((offsets[indices + 1] - offsets[indices]).sum()) <= POOL_MAX_TOKENS
        return cls(_CacheDocuments(cache, indices, pool), **spec)

    # -- the dataset protocol -------------------------------------------------------------------

    def make(self, key: PRNGKeyArray | None) -> tuple[SpliceDevice, SpliceLMDataset]:
        """The schedule for ``key`` (``None`` when the spec draws nothing), the pool, the frames;
        the host half is the dataset itself."""
        frame = FrameBuild(**self.frame_args, cyclic=self.cyclic, margin=self.content_margin)
        return SpliceDevice(build_schedule(self.doc_lengths, self.spec, key), self.pool, frame), self

    def spans(self, plan: Plan) -> Spans:
        """Global token spans of the rows' copies (fetch mode)."""
        detail = plan.detail
        starts = self.doc_starts[detail.doc.astype(np.int64)] + detail.t
        lengths = detail.copy_len.astype(np.int64)
        return Spans(np.zeros((starts.shape[0], 1), np.int32), starts[:, None], lengths[:, None])

    def provenance(self, plan: Plan) -> RowSources:
        """Each row's copied tokens: ``copy_len`` tokens of its document from ``t``, at frame
        position ``s`` (cyclic rows: the document's end, then its start); no token is read."""
        d = jax.tree.map(np.asarray, plan.detail)
        doc, t, s, copy = (np.asarray(x, np.int64) for x in (d.doc, d.t, d.s, d.copy_len))
        n = doc.shape[0]
        out = RowSources.empty(n, 2 if self.cyclic else 1)
        out.example[:] = np.asarray(plan.example, np.int64)
        name = source_name(self.doc_source) if self.doc_source is not None else "documents"
        head = np.minimum(copy, self.doc_lengths[doc] - t) if self.cyclic else copy
        pieces = [(t, head, s)]
        if self.cyclic:
            pieces.append((np.zeros(n, np.int64), copy - head, s + head))
        for j, (begin, length, at) in enumerate(pieces):
            used = length > 0
            out.source[used, j] = name
            out.doc[used, j] = self.doc_rows[doc[used]]
            out.doc_start[:, j] = np.where(used, begin, 0)
            out.start[:, j] = np.where(used, self.doc_starts[doc] + begin, 0)
            out.length[:, j] = np.where(used, length, 0)
            out.row_offset[:, j] = np.where(used, at, 0)
        return out

    def __repr__(self) -> str:
        mode = "fetch" if self.fetches else "pool"
        docs, rows = len(self.doc_lengths), self.num_examples
        return f"SpliceLMDataset(docs={docs}, rows={rows}, {mode}, spec={self.spec})"
