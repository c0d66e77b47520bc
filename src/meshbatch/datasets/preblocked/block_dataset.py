"""``BlockDataset``: preblocked blocks as a pipeline dataset, from a store, ``chunk*.npy`` or a cache.

The format is detected from the first path; every path must have the same one:

* preblocked (a ``meshbatch.preblock`` store or ``chunk*.npy`` matrices): example ``b`` is block
  ``b``; a row reads one span, the whole block, coalesced with its neighbours by the pipeline;
* legacy (a jagged Levanter token cache): the documents are packed on the fly by the same packing
  plan as the writer (``plan_layout``), so example ``b`` is the block the writer would have written
  as row ``b`` with ``key=BlockDataset.pack_key(pipeline key)``. The dataset holds no key: it
  packs when the pipeline makes it for its key (``make(key)`` returns the packed host half, which
  knows ``num_examples`` and ``spans_per_row``). A row reads up to ``spans_per_row`` spans, the
  tokens of each document piece in the block; the build kernel inserts the markers and padding.

Build (per shard): ``block_batch`` (segment ids from the ``[DOC]`` markers, padding its own segment,
no loss on padding or across a document boundary). ``real_tokens`` is the block's non-pad count,
stored (or computed from the layout) so it is known at plan time.

    BlockDataset("/data/blocks")                                   # a store
    BlockDataset("/data/cache", pack=PackSpec(128), vocab_size=257)  # legacy, packed on the fly
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key, check_int, check_token_id
from meshbatch.cache import DEFAULT_CHUNK_SIZE, TokenCache
from meshbatch.datasets.protocol import Dataset, Plan, Spans
from meshbatch.datasets.provenance import RowSources, from_spans
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

from .block_device import BlockDevice
from .block_sources import open_blocks
from .block_store import STRUCTURAL_IDS, check_paths, check_structural_ids, detect_format, tokenizer_markers
from .masking import MLMMasking
from .pack_layout import PackSpec, plan_layout

logger = logging.getLogger(__name__)
PACK_TAG = 0x5041434B  # "PACK": the packing key is fold_in(pipeline key, PACK_TAG)


class BlockDataset(Dataset):
    """Fixed blocks of ``[DOC] ... [EOD]`` documents (see the module docstring).

    Args:
        paths: one path or several of the same format.
        shuffle: example order (``meshbatch.ShuffleSpec``); default a full permutation.
        pack: legacy mode only: how the caches' documents are packed (``PackSpec``).
        doc_id, eod_id, pad_id, vocab_size: the structural ids and vocabulary; read from the
            header of preblocked data when not given, required in legacy mode.
        field: legacy mode: the cache field.

    Raises:
        ValueError: mixed formats, inconsistent block sizes or ids, missing ids.
    """

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        shuffle=None,
        pack: PackSpec | None = None,
        doc_id: int | None = None,
        eod_id: int | None = None,
        pad_id: int | None = None,
        vocab_size: int | None = None,
        field: str = "input_ids",
    ):
        paths = check_paths("paths", paths)
        if not paths:
            raise ValueError("paths must name at least one store, chunk directory or cache (got [])")
        formats = [detect_format(p) for p in paths]
        if len(set(formats)) > 1:
            listing = ", ".join(f"{p} is {f}" for p, f in zip(paths, formats, strict=True))
            raise ValueError(f"mixed formats in one dataset are not supported ({listing})")
        self.format = formats[0]
        self.legacy = self.format == "levanter"
        self.shuffle_spec = ShuffleSpec() if shuffle is None else shuffle
        if not isinstance(self.shuffle_spec, ShuffleSpec):
            raise TypeError(f"shuffle must be a ShuffleSpec (got shuffle={shuffle!r})")
        given = {"doc_id": doc_id, "eod_id": eod_id, "pad_id": pad_id, "vocab_size": vocab_size}
        if self.legacy:
            if pack is None:
                raise ValueError(
                    "a jagged token cache needs pack=PackSpec(block_size, ...) to be packed on the fly"
                )
            missing = [name for name, v in given.items() if v is None]
            if missing:
                raise ValueError(f"legacy mode needs {missing} (a token cache has no preblock header)")
            self.ids = {name: check_token_id(name, v) for name, v in given.items()}
            check_structural_ids({n: self.ids[n] for n in STRUCTURAL_IDS}, self.ids["vocab_size"])
            if not isinstance(pack, PackSpec):
                raise TypeError(f"pack must be a PackSpec (got pack={pack!r})")
            if not isinstance(field, str):
                raise TypeError(f"field must be a str (got field={field!r})")
            check_int("vocab_size", self.ids["vocab_size"], low=1)
            self.pack = pack
            self.sources = tuple(TokenCache.open(p, field) for p in paths)
            self.seq_len = self.max_row_tokens = pack.block_size
            self.packed = False  # its blocks exist once packed for a key (make)
            return
        else:
            if pack is not None:
                raise ValueError("pack applies to jagged token caches; preblocked data is packed already")
            self.sources = tuple(open_blocks(p, pad_id=pad_id) for p in paths)
            self.ids = _preblocked_ids(self.sources, given)
            check_structural_ids(
                {n: self.ids[n] for n in STRUCTURAL_IDS},
                self.ids["vocab_size"],
                in_vocab=tokenizer_markers(self.sources, self.ids),
            )
            sizes = {s.block_size for s in self.sources}
            if len(sizes) != 1:
                raise ValueError(f"the paths hold blocks of different sizes {sorted(sizes)}")
            self.seq_len = sizes.pop()
            self.max_row_tokens, self.spans_per_row = self.seq_len, 1
            self._blocks = [s.num_blocks for s in self.sources]
            self._real = np.concatenate([s.real_tokens() for s in self.sources])
        check_int("vocab_size", self.ids["vocab_size"], low=1)
        self.packed = True
        self._count_blocks()

    def _count_blocks(self) -> None:
        total = sum(self._blocks)
        if not 1 <= total <= 2**32 - 1:
            raise ValueError(f"{total} blocks: need 1 <= blocks <= 2**32 - 1")
        self.num_examples = total
        self._source_start = np.concatenate([[0], np.cumsum(self._blocks)]).astype(np.int64)

    def __getattr__(self, name: str):
        if name in ("num_examples", "spans_per_row", "layouts"):  # only missing before packing
            raise AttributeError(
                f"a jagged cache's blocks depend on the packing key, which derives from the "
                f"pipeline's key: {name} is known on the dataset BlockDataset.make(key) returns "
                f"(dataset.make(key)[1].{name})"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @staticmethod
    def pack_key(key: PRNGKeyArray) -> PRNGKeyArray:
        """The packing key of a jagged cache under the pipeline's ``key``: ``fold_in(key,
        PACK_TAG)`` (the shuffle uses ``key`` itself). A store written with ``preblock(...,
        key=BlockDataset.pack_key(key))`` holds exactly the blocks packed on the fly."""
        return jax.random.fold_in(as_key(key), PACK_TAG)

    def packed_for(self, key: PRNGKeyArray) -> BlockDataset:
        """Legacy mode: the host half for the pipeline's ``key``, a new value whose caches are
        packed with ``pack_key(key)``; a preblocked dataset is its own."""
        if self.packed:
            return self
        host = copy.copy(self)
        host._pack_caches(self.pack_key(key))
        host.packed = True
        host._count_blocks()
        return host

    def _pack_caches(self, key: PRNGKeyArray) -> None:
        caches, pack = self.sources, self.pack
        layouts = [plan_layout(c.doc_lengths(), pack, key) for c in caches]
        S = pack.block_size
        packed, first, count, start_block, start_offset, size, real = ([] for _ in range(7))
        self._entry_doc, self._entry_source, self._doc_offsets = [], [], []
        block_base = entry_base = 0
        for i, (cache, layout) in enumerate(zip(caches, layouts, strict=True)):
            order = layout.by_position()
            lo, hi = layout.block_docs(order)
            packed.append(layout.block_order + block_base)
            first.append(lo + entry_base)
            count.append(hi - lo)
            start_block.append(layout.starts[order] // S + block_base)
            start_offset.append(layout.starts[order] % S)
            size.append(layout.sizes[order])
            real.append(layout.real_tokens())
            self._entry_doc.append(order)
            self._entry_source.append(np.full(order.shape, i, np.int32))
            self._doc_offsets.append(cache.doc_offsets())
            block_base += layout.num_blocks
            entry_base += layout.num_docs
        if block_base > 2**31 - 1 or entry_base > 2**31 - 1:
            raise ValueError(
                f"{block_base} blocks of {entry_base} documents: packing on the fly indexes them in "
                "int32; write a store (meshbatch.preblock) or split the caches"
            )
        cat = lambda parts: np.concatenate(parts).astype(np.int32)  # noqa: E731
        self._legacy = dict(
            packed=cat(packed),
            first=cat(first),
            count=cat(count),
            start_block=cat(start_block),
            start_offset=cat(start_offset),
            size=cat(size),
        )
        self._entry_doc = np.concatenate(self._entry_doc)
        self._entry_source = np.concatenate(self._entry_source)
        self._real = np.concatenate([r[lay.block_order] for r, lay in zip(real, layouts, strict=True)])
        self.spans_per_row = max(1, int(self._legacy["count"].max()))
        self.max_row_tokens = S
        self._blocks = [lay.num_blocks for lay in layouts]
        self.layouts = layouts

    # -- the protocol --------------------------------------------------------------------------

    def make(self, key: PRNGKeyArray) -> tuple[BlockDevice, BlockDataset]:
        """Both halves for ``key``; legacy mode packs the caches for it first (``packed_for``)."""
        host = self.packed_for(key)
        return host.device(key), host

    def device(self, key: PRNGKeyArray) -> BlockDevice:
        """The block order for ``key`` and the tables (legacy: the packing's pieces)."""
        if not self.packed:
            return self.make(key)[0]
        chunk = max(1, DEFAULT_CHUNK_SIZE // self.seq_len)  # a block shuffle's block: one read chunk
        shuffle = self.shuffle_spec.create(self.num_examples, key, default_block=chunk)
        names = ("packed", "first", "count", "start_block", "start_offset", "size")
        legacy = {k: jnp.asarray(self._legacy[k]) if self.legacy else None for k in names}
        return BlockDevice(
            shuffle=shuffle,
            source_start=jnp.asarray(self._source_start.astype(np.uint32)),
            real=jnp.asarray(self._real),
            **legacy,
            shuffle_spec=self.shuffle_spec,
            seq_len=self.seq_len,
            spans_per_row=self.spans_per_row,
            doc_id=self.ids["doc_id"],
            eod_id=self.ids["eod_id"],
            pad_id=self.ids["pad_id"],
        )

    def spans(self, plan: Plan) -> Spans:
        S = self.seq_len
        if not self.legacy:
            start = plan.detail.block.astype(np.int64)[:, None] * S
            return Spans(plan.source[:, None].astype(np.int32), start, np.full_like(start, S))
        d = plan.detail
        entry = d.entry
        source = self._entry_source[entry]
        doc = self._entry_doc[entry]
        token_lo = np.maximum(d.slot_start - 1, 0).astype(np.int64)
        token_hi = np.minimum(d.slot_start + d.slots - 1, d.size - 2).astype(np.int64)
        length = np.where(d.slots > 0, np.maximum(token_hi - token_lo, 0), 0)
        offsets = np.zeros(entry.shape, np.int64)
        for i, doc_offsets in enumerate(self._doc_offsets):
            mine = source == i
            offsets[mine] = doc_offsets[doc[mine]]
        start = np.where(length > 0, offsets + token_lo, 0)  # unused slots read nothing
        return Spans(source.astype(np.int32), start, length)

    def provenance(self, plan: Plan) -> RowSources:
        """Preblocked: each row is one block of its store (``doc``: the block). Packed on the fly:
        each piece of a cache document, where it lands in the row (after its ``[DOC]`` marker
        when it is the document's first); no token is read."""
        if not self.legacy:  # a store's rows are its blocks
            out = super().provenance(plan)
            out.doc[:] = np.where(out.length > 0, out.start // self.seq_len, -1)
            out.doc_start[:] = 0
            return out
        spans = self.spans(plan)
        d = plan.detail
        out = from_spans(self.sources, spans.source, spans.start, spans.length, plan.example)
        used = spans.length > 0
        token_lo = np.maximum(d.slot_start - 1, 0).astype(np.int64)
        out.doc[:] = np.where(used, self._entry_doc[d.entry], -1)
        out.doc_start[:] = np.where(used, token_lo, 0)
        out.row_offset[:] = np.where(used, d.row_start + token_lo + 1 - d.slot_start, 0)
        return out

    # -- conveniences --------------------------------------------------------------------------

    def masking(self, key, *, mask_id: int | None = None, **options) -> MLMMasking:
        """An ``MLMMasking`` stage for these blocks: markers and padding are never masked; the
        mask id defaults to one past the largest structural id."""
        ids = self.ids
        specials = (ids["doc_id"], ids["eod_id"], ids["pad_id"])
        mask_id = max(max(specials), ids["vocab_size"] - 1) + 1 if mask_id is None else mask_id
        return MLMMasking(key, mask_id=mask_id, vocab_size=ids["vocab_size"], special_ids=specials, **options)

    def __repr__(self) -> str:
        return (
            f"BlockDataset(format={self.format!r}, blocks={self.num_examples}, block_size={self.seq_len}, "
            f"ids={self.ids}, shuffle={self.shuffle_spec})"
        )


def _preblocked_ids(sources, given: dict) -> dict[str, int]:
    ids = {}
    for name, value in given.items():
        found = {getattr(s.header, name) for s in sources if s.header is not None}
        if value is None:
            if len(found) != 1 or any(s.header is None for s in sources):
                raise ValueError(f"{name} is needed: the headers give {sorted(found) or 'none'}")
            value = found.pop()
        ids[name] = check_token_id(name, value)
    return ids
