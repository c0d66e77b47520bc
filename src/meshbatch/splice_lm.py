"""Splice datasets on the pipeline: selected documents, placed by a schedule, built per shard.

Two ways to hold the documents, same batches either way:

* pool (default for small selections): the selected documents live on every device; plan and
  build run together in the per-shard kernel and the host only computes row indices;
* fetch: only the cache's offsets stay on the host; each step reads the rows' spans
  (``offsets[doc] + t``, ``copy_len`` tokens), coalesced, and the kernel places them.

    cache docs = [d0 .. d99], selected = [7, 42], seq_len = 8, content_length = 4
    row -> (doc=1, t=3, s=4, copy_len=4): tokens = [P P P P d42[3] d42[4] d42[5] d42[6]]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from meshbatch.kernels import Batch
from meshbatch.kernels.splice import DocumentPool, pool_frames, splice_frames
from meshbatch.kernels.splice_schedule import lookup_rows

from .splice import SpliceSpec, build_schedule

# A selection up to this many tokens is copied to every device (4 bytes a token).
POOL_MAX_TOKENS = 1 << 26


class SpliceLMDataset:
    """A splice dataset (``splice-document-dataset.md``) for ``Pipeline``.

    Build it with ``SpliceLMDataset(docs, **spec)`` from token arrays, or
    ``SpliceLMDataset.from_cache(cache, selection, **spec)`` from a ``TokenCache`` and the
    indices ``select_documents`` chose. ``spec`` takes ``SpliceSpec``'s fields; without a
    ``key`` in it, the pipeline's key drives the spec's shuffles and jitter.

    Attributes:
        seq_len: frame length.
        num_examples: rows per epoch (``len`` of the schedule).
        fetches: whether steps read spans from the cache (``False``: a device pool).
        doc_lengths: int64 lengths of the selected documents (``doc_idx`` indexes them).
    """

    def __init__(self, docs: Sequence[np.ndarray], **spec):
        if docs is None or len(docs) == 0:
            raise ValueError(f"give at least one document (got docs={docs!r}); or use from_cache")
        self._init(docs=docs, source=None, doc_offsets=None, **spec)

    @classmethod
    def from_cache(cls, cache, indices, *, pool: bool | None = None, **spec) -> SpliceLMDataset:
        """Documents ``indices`` of ``cache``; ``pool=None`` pools selections of at most
        ``POOL_MAX_TOKENS`` tokens and fetches larger ones."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size == 0:
            raise ValueError("select at least one document (got no indices)")
        bad = indices[(indices < 0) | (indices >= cache.num_rows)]
        if bad.size:
            raise ValueError(
                f"document index {int(bad[0])} out of range for a cache of {cache.num_rows} rows"
            )
        offsets = cache.doc_offsets()
        lengths = offsets[indices + 1] - offsets[indices]
        if pool is None:
            pool = int(lengths.sum()) <= POOL_MAX_TOKENS
        self = cls.__new__(cls)
        if pool:
            self._init(docs=cache.read_rows(indices), source=None, doc_offsets=None, **spec)
        else:
            self._init(docs=None, source=cache, doc_offsets=(offsets[indices], lengths), **spec)
        return self

    def _init(self, *, docs, source, doc_offsets, **spec):
        own_key = spec.pop("key", None)
        # Checked with a stand-in key when none is given: the pipeline's key replaces it.
        self.spec = SpliceSpec(**spec, key=jax.random.key(0) if own_key is None else own_key)
        if self.spec.pad_token_id is None:
            raise ValueError("pad_token_id is required to build frames (got pad_token_id=None)")
        if docs is not None:
            self.pool = DocumentPool.from_documents(docs, margin=self.spec.seq_len)
            self.doc_lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
        else:
            self.pool = None
            self._doc_starts, self.doc_lengths = (np.asarray(a, dtype=np.int64) for a in doc_offsets)
        self.source = source
        self.fetches = source is not None
        self.seq_len = self.spec.seq_len
        # A spec that shuffles without its own key takes the pipeline's (plan_state); rows per
        # epoch do not depend on the key, so any key counts them.
        keyless = self.spec.needs_key and own_key is None
        self._schedule = None if keyless else build_schedule(self.doc_lengths, self.spec)
        self._keyed_schedules: dict[bytes, object] = {}
        counted = (
            self._schedule
            if self._schedule is not None
            else build_schedule(self.doc_lengths, self.spec, log_summary=False)
        )
        self.num_examples = len(counted)
        self.cyclic = counted.placement.cyclic
        if self.fetches and self.cyclic:
            raise ValueError(
                "content_start_mode='cyclic_roll' reads across the document end; it needs the "
                "documents on device (pool=True)"
            )
        self.frame_args = dict(
            seq_len=self.seq_len,
            pad_token_id=self.spec.pad_token_id,
            eos_token_id=self.spec.eos_token_id,
            segment_mode=self.spec.segment_mode,
        )

    def _build(self, key):
        return build_schedule(self.doc_lengths, dataclasses.replace(self.spec, key=key))

    # -- the pipeline's dataset protocol ------------------------------------------------------

    def plan_state(self, key: PRNGKeyArray):
        """The schedule (keyed by the spec, else by ``key``) and, in pool mode, the documents."""
        if self._schedule is not None:
            return {"schedule": self._schedule, "pool": self.pool}
        data = np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
        cached = self._keyed_schedules.get(data.tobytes())
        if cached is None:
            cached = self._keyed_schedules[data.tobytes()] = self._build(key)
        return {"schedule": cached, "pool": self.pool}

    def plan(self, state, positions, epochs) -> dict[str, Int[Array, " n"]]:
        """Each row's ``(doc, t, s, copy_len)`` from the schedule."""
        doc, t, s, copy_len = lookup_rows(state["schedule"], positions, epochs)
        return {"doc": doc, "t": t, "s": s, "copy_len": copy_len}

    def spans(self, planned) -> tuple[np.ndarray, np.ndarray]:
        """Global token spans of the rows' copies (fetch mode)."""
        doc = planned["doc"].astype(np.int64)
        return self._doc_starts[doc] + planned["t"], planned["copy_len"].astype(np.int64)

    def build(self, state, content: Int[Array, "rows seq"] | None, planned) -> Batch:
        """Frames from fetched spans (``content`` rows, left-aligned) or from the device pool."""
        if content is None:
            return pool_frames(
                state["pool"],
                planned["doc"],
                planned["t"],
                planned["s"],
                planned["copy_len"],
                cyclic=self.cyclic,
                **self.frame_args,
            )
        rows = content.shape[0]
        src_start = jnp.arange(rows, dtype=jnp.int32) * self.seq_len
        return splice_frames(
            content.reshape(-1),
            src_start,
            planned["s"],
            planned["copy_len"],
            doc_idx=planned["doc"],
            **self.frame_args,
        )

    def __repr__(self) -> str:
        mode = "fetch" if self.fetches else "pool"
        docs, rows = len(self.doc_lengths), self.num_examples
        return f"SpliceLMDataset(docs={docs}, rows={rows}, {mode}, spec={self.spec})"
