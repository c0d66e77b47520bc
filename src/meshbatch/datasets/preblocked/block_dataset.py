"""Preblocked blocks as pipeline datasets: ``BlockDataset`` reads a store or ``chunk*.npy``;
``CacheBlockDataset`` packs a jagged Levanter token cache into the same blocks on the fly.

* ``BlockDataset`` (a ``meshbatch.preblock`` store or ``chunk*.npy`` matrices): example ``b`` is
  block ``b``; a row reads one span, the whole block, coalesced with its neighbours by the
  pipeline;
* ``CacheBlockDataset`` (a jagged token cache): the documents are packed by the same packing plan
  as the writer (``plan_layout``), so example ``b`` is the block the writer would have written as
  row ``b`` with ``key=BlockDataset.pack_key(pipeline key)``. The dataset holds no key: it packs
  when the pipeline makes it for its key (``make(key)`` returns the packed host half, which knows
  ``num_examples`` and ``spans_per_row``). A row reads up to ``spans_per_row`` spans, the tokens
  of each document piece in the block; the build kernel inserts the markers and padding.

The device half, ``BlockDevice``: each row's plan, and what build does with it::

    preblocked: example b -> source by ``source_start``, block within it -> BlockPlan(block)
    on the fly: example b -> packed block p -> its pieces (entries first[p] .. first[p] + count[p])
                -> PiecesPlan(entry, row_start, slot_start, slots, size), [n, spans_per_row] each
    build:      gather_windows (preblocked) or assemble_rows (on the fly), then block_batch

Build (per shard): ``block_batch`` (segment ids from the ``[DOC]`` markers, padding its own segment,
no loss on padding or across a document boundary). ``real_tokens`` is the block's non-pad count,
stored (or computed from the layout) so it is known at plan time.

    BlockDataset("/data/blocks")                                        # a store
    CacheBlockDataset("/data/cache", pack=PackSpec(128), vocab_size=257, doc_id=..., ...)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from meshbatch.arguments import as_key, check_bool, check_choice, check_float, check_int, check_token_id
from meshbatch.cache import DEFAULT_CHUNK_SIZE, TokenCache
from meshbatch.datasets.protocol import Content, Dataset, DeviceDataset, Plan, Rows, Spans, replace
from meshbatch.datasets.provenance import RowSources, from_spans
from meshbatch.kernels import Batch, block_batch, gather_windows, mlm_mask
from meshbatch.kernels.internal import assemble_rows, row_keys
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

from .block_sources import open_blocks
from .block_store import check_paths, detect_format, resolve_ids
from .pack_layout import Layout, PackSpec, piece_tokens, plan_layout

logger = logging.getLogger(__name__)
PACK_TAG = 0x5041434B  # "PACK": the packing key is fold_in(pipeline key, PACK_TAG)
PIECE_TABLES = ("packed", "first", "count", "start_block", "start_offset", "size")
MODES = ("dynamic", "static")


class BlockPlan(eqx.Module):
    """A preblocked row's plan detail: the block within its source."""

    block: Int[Array, " n"]


class PiecesPlan(eqx.Module):
    """A row's plan detail when packed on the fly: its packed block's document pieces, ``[n, spans_per_row]``
    each (entry, where the piece starts in the row and in the document's slots, its slots, the
    document's size)."""

    entry: Int[Array, "n k"]
    row_start: Int[Array, "n k"]
    slot_start: Int[Array, "n k"]
    slots: Int[Array, "n k"]
    size: Int[Array, "n k"]


class BlockDevice(DeviceDataset):
    """The device half of both block datasets (the pieces' tables are ``None`` for ``BlockDataset``).

    Attributes:
        shuffle: the block order for the key (``None`` for source order).
        source_start: first global example of each source; ``real``: non-pad tokens per example.
        packed, first, count: on the fly: per example, its packed block, first piece entry, pieces.
        start_block, start_offset, size: on the fly: per entry (document, by position).
        shuffle_spec, seq_len, spans_per_row, doc_id, eod_id, pad_id: configuration (static).
    """

    shuffle: eqx.Module | None
    source_start: Int[Array, " sources_plus_1"]
    real: Int[Array, " blocks"]
    packed: Int[Array, " blocks"] | None
    first: Int[Array, " blocks"] | None
    count: Int[Array, " blocks"] | None
    start_block: Int[Array, " entries"] | None
    start_offset: Int[Array, " entries"] | None
    size: Int[Array, " entries"] | None
    shuffle_spec: ShuffleSpec = eqx.field(static=True)
    seq_len: int = eqx.field(static=True)
    spans_per_row: int = eqx.field(static=True)
    doc_id: int = eqx.field(static=True)
    eod_id: int = eqx.field(static=True)
    pad_id: int = eqx.field(static=True)

    @property
    def on_the_fly(self) -> bool:
        """Whether the blocks are packed on the fly (``CacheBlockDataset``): the pieces' tables."""
        return self.packed is not None

    def plan(self, rows: Rows, state=None) -> tuple[Plan, None]:
        example = self.shuffle_spec.apply(self.shuffle, rows.position, rows.epoch)
        source = jnp.searchsorted(self.source_start, example, side="right").astype(jnp.int32) - 1
        local = (example - self.source_start[source]).astype(jnp.int32)
        detail = self._pieces(self.packed[example]) if self.on_the_fly else BlockPlan(local)
        return Plan(rows=rows, source=source, example=example, detail=detail), None

    def _pieces(self, packed: Int[Array, " n"]) -> PiecesPlan:
        S, k = self.seq_len, self.spans_per_row
        slot = jnp.arange(k, dtype=jnp.int32)[None, :]
        used = slot < self.count[packed][:, None]
        entry = jnp.where(used, self.first[packed][:, None] + slot, 0)
        start_block, start_offset, size = (t[entry] for t in (self.start_block, self.start_offset, self.size))
        here = start_block == packed[:, None]
        row_start = jnp.where(here, start_offset, 0)
        slot_start = jnp.where(here, 0, (packed[:, None] - start_block) * S - start_offset)
        slots = jnp.where(used, jnp.minimum(size - slot_start, S - row_start), 0)
        return PiecesPlan(entry, row_start, slot_start, slots, size)

    def build(self, plan: Plan, content: Content | None) -> Batch:
        ids = dict(doc_id=self.doc_id, eod_id=self.eod_id, pad_id=self.pad_id)
        if self.on_the_fly:
            d = plan.detail
            tokens = assemble_rows(
                content.tokens,
                content.offsets,
                d.row_start,
                d.slot_start,
                d.slots,
                d.size,
                block_size=self.seq_len,
                **ids,
            )
        else:
            tokens = gather_windows(content.tokens, content.offsets[:, 0], width=self.seq_len)
        return block_batch(tokens, **ids)

    def real_tokens(self, plan: Plan) -> Int[Array, " n"]:
        return self.real[plan.example]


class _Blocks(Dataset):
    """What both block datasets share: the ids, the order, the block build and its device half."""

    format: str
    shuffle_spec: ShuffleSpec
    ids: dict[str, int]
    seq_len: int
    max_row_tokens: int

    def _start(self, paths, shuffle, *, cache: bool) -> list[str]:
        """Checks ``paths`` (one format, the one this class reads) and ``shuffle``."""
        paths = check_paths("paths", paths)
        if not paths:
            raise ValueError("paths must name at least one store, chunk directory or cache (got [])")
        formats = [detect_format(p) for p in paths]
        if len(set(formats)) > 1:
            listing = ", ".join(f"{p} is {f}" for p, f in zip(paths, formats, strict=True))
            raise ValueError(f"mixed formats in one dataset are not supported ({listing})")
        self.format = formats[0]
        if cache and self.format != "levanter":
            raise ValueError(
                f"{paths[0]} holds preblocked data ({self.format}), packed already: read it with "
                "BlockDataset(paths); CacheBlockDataset packs a jagged token cache"
            )
        if not cache and self.format == "levanter":
            raise ValueError(
                f"{paths[0]} is a jagged token cache: CacheBlockDataset(paths, pack=PackSpec(block_size, "
                "...), doc_id=..., eod_id=..., pad_id=..., vocab_size=...) packs it on the fly"
            )
        self.shuffle_spec = ShuffleSpec() if shuffle is None else shuffle
        if not isinstance(self.shuffle_spec, ShuffleSpec):
            raise TypeError(f"shuffle must be a ShuffleSpec (got shuffle={shuffle!r})")
        return paths

    @staticmethod
    def pack_key(key: PRNGKeyArray) -> PRNGKeyArray:
        """The packing key of a jagged cache under the pipeline's ``key``: ``fold_in(key,
        PACK_TAG)`` (the shuffle uses ``key`` itself). A store written with ``preblock(...,
        key=BlockDataset.pack_key(key))`` holds exactly the blocks packed on the fly."""
        return jax.random.fold_in(as_key(key), PACK_TAG)

    def _device(self, key: PRNGKeyArray, source_start, real, pieces: dict) -> BlockDevice:
        """The block order for ``key`` and the tables (``pieces``: the packing's, or ``None``s)."""
        chunk = max(1, DEFAULT_CHUNK_SIZE // self.seq_len)  # a block shuffle's block: one read chunk
        shuffle = self.shuffle_spec.create(self.num_examples, key, default_block=chunk)
        return BlockDevice(
            shuffle=shuffle,
            source_start=jnp.asarray(source_start.astype(np.uint32)),
            real=jnp.asarray(real),
            **pieces,
            shuffle_spec=self.shuffle_spec,
            seq_len=self.seq_len,
            spans_per_row=self.spans_per_row,
            doc_id=self.ids["doc_id"],
            eod_id=self.ids["eod_id"],
            pad_id=self.ids["pad_id"],
        )

    def masking(self, key, *, mask_id: int | None = None, **options) -> MLMMasking:
        """An ``MLMMasking`` stage for these blocks: markers and padding are never masked; the
        mask id defaults to one past the largest structural id."""
        ids = self.ids
        specials = (ids["doc_id"], ids["eod_id"], ids["pad_id"])
        mask_id = max(max(specials), ids["vocab_size"] - 1) + 1 if mask_id is None else mask_id
        return MLMMasking(key, mask_id=mask_id, vocab_size=ids["vocab_size"], special_ids=specials, **options)

    def __repr__(self) -> str:
        try:
            blocks = self.num_examples
        except AttributeError:  # a cache not yet packed for a key
            blocks = "unpacked"
        return (
            f"{type(self).__name__}(format={self.format!r}, blocks={blocks}, "
            f"block_size={self.seq_len}, ids={self.ids}, shuffle={self.shuffle_spec})"
        )


class BlockDataset(_Blocks):
    """Fixed blocks of ``[DOC] ... [EOD]`` documents from a store or ``chunk*.npy`` (see the
    module docstring; a jagged token cache is ``CacheBlockDataset``'s).

    Args:
        paths: one path or several of the same format.
        shuffle: example order (``meshbatch.ShuffleSpec``); default a full permutation.
        doc_id, eod_id, pad_id, vocab_size: the structural ids and vocabulary; read from the
            header when not given.
        pack: refused: packing a token cache on the fly is ``CacheBlockDataset``.

    Raises:
        ValueError: mixed formats, a token cache, inconsistent block sizes or ids, missing ids.
    """

    num_examples: int
    spans_per_row: int
    source_start: np.ndarray  # first global example of each source, and the total
    real: np.ndarray  # non-pad tokens per block

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        shuffle=None,
        doc_id: int | None = None,
        eod_id: int | None = None,
        pad_id: int | None = None,
        vocab_size: int | None = None,
        pack: None = None,
    ):
        if pack is not None:
            raise TypeError(
                f"BlockDataset reads preblocked data and takes no pack (got pack={pack!r}): "
                "CacheBlockDataset(paths, pack=..., ...) packs a jagged token cache on the fly"
            )
        paths = self._start(paths, shuffle, cache=False)
        given = {"doc_id": doc_id, "eod_id": eod_id, "pad_id": pad_id, "vocab_size": vocab_size}
        self.sources = tuple(open_blocks(p, pad_id=pad_id) for p in paths)
        self.ids = resolve_ids(self.sources, given)
        sizes = {s.block_size for s in self.sources}
        if len(sizes) != 1:
            raise ValueError(f"the paths hold blocks of different sizes {sorted(sizes)}")
        self.seq_len = sizes.pop()
        self.max_row_tokens, self.spans_per_row = self.seq_len, 1
        self.real = np.concatenate([s.real_tokens() for s in self.sources])
        self.num_examples, self.source_start = _count_blocks([s.num_blocks for s in self.sources])

    def make(self, key: PRNGKeyArray) -> tuple[BlockDevice, BlockDataset]:
        """The block order for ``key``; the host half is the dataset itself."""
        return self._device(key, self.source_start, self.real, dict.fromkeys(PIECE_TABLES)), self

    def spans(self, plan: Plan) -> Spans:
        """Each row's block: one span of ``seq_len`` tokens of its source."""
        start = plan.detail.block.astype(np.int64)[:, None] * self.seq_len
        return Spans(plan.source[:, None].astype(np.int32), start, np.full_like(start, self.seq_len))

    def provenance(self, plan: Plan) -> RowSources:
        """Each row is one block of its store (``doc``: the block); no token is read."""
        out = super().provenance(plan)
        out.doc[:] = np.where(out.length > 0, out.start // self.seq_len, -1)
        out.doc_start[:] = 0
        return out


class PackedBlocks(NamedTuple):
    """A ``CacheBlockDataset``'s caches packed for a key: the device half's piece tables
    (``PIECE_TABLES``, int32), and for the host each entry's document, cache (int32) and first
    token in that cache, each block's real tokens, the layouts and where each cache's blocks start."""

    pieces: dict[str, np.ndarray]
    entry_doc: np.ndarray
    entry_source: np.ndarray
    entry_offset: np.ndarray
    real: np.ndarray
    layouts: list[Layout]
    num_examples: int
    source_start: np.ndarray
    spans_per_row: int  # the most pieces a block holds


class CacheBlockDataset(_Blocks):
    """The blocks of ``BlockDataset``, packed on the fly from jagged Levanter token caches (see
    the module docstring): the blocks ``preblock(..., key=BlockDataset.pack_key(key))`` writes.

    Args:
        pack: how the caches' documents are packed (``PackSpec``), the writer's.
        doc_id, eod_id, pad_id, vocab_size: the structural ids and vocabulary (required: a token
            cache has no preblock header).
        shuffle: example order (``meshbatch.ShuffleSpec``); default a full permutation.

    ``num_examples``, ``spans_per_row`` and ``layouts`` depend on the packing, whose key derives
    from the pipeline's: they are known on the host half ``make(key)`` returns (``packed``).

    Raises:
        ValueError: mixed formats, preblocked data, missing or inconsistent ids.
    """

    pack: PackSpec
    packed: PackedBlocks | None  # ``None`` until made for a key

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        pack: PackSpec,
        doc_id: int,
        eod_id: int,
        pad_id: int,
        vocab_size: int,
        shuffle=None,
        field: str = "input_ids",
    ):
        paths = self._start(paths, shuffle, cache=True)
        given = {"doc_id": doc_id, "eod_id": eod_id, "pad_id": pad_id, "vocab_size": vocab_size}
        missing = [name for name, v in given.items() if v is None]
        if missing:
            raise ValueError(f"CacheBlockDataset needs {missing} (a token cache has no preblock header)")
        self.ids = resolve_ids((), given)
        if not isinstance(pack, PackSpec):
            raise TypeError(f"pack must be a PackSpec (got pack={pack!r})")
        if not isinstance(field, str):
            raise TypeError(f"field must be a str (got field={field!r})")
        self.pack = pack
        self.sources = tuple(TokenCache.open(p, field) for p in paths)
        self.seq_len = self.max_row_tokens = pack.block_size
        self.packed = None

    def _packed(self, name: str) -> PackedBlocks:
        if self.packed is None:
            raise AttributeError(
                f"a jagged cache's blocks depend on the packing key, which derives from the "
                f"pipeline's key: {name} is known on the dataset CacheBlockDataset.make(key) returns "
                f"(dataset.make(key)[1].{name})"
            )
        return self.packed

    @property
    def num_examples(self) -> int:
        return self._packed("num_examples").num_examples

    @property
    def spans_per_row(self) -> int:
        return self._packed("spans_per_row").spans_per_row

    @property
    def layouts(self) -> list[Layout]:
        return self._packed("layouts").layouts

    def packed_for(self, key: PRNGKeyArray) -> CacheBlockDataset:
        """The host half for the pipeline's ``key``: a new value whose caches are packed with
        ``pack_key(key)`` (itself once packed)."""
        if self.packed is not None:
            return self
        return replace(self, packed=_pack_caches(self.sources, self.pack, self.pack_key(key)))

    def make(self, key: PRNGKeyArray) -> tuple[BlockDevice, CacheBlockDataset]:
        """Both halves for ``key``: the caches packed for it (``packed_for``), the block order and
        the packing's piece tables."""
        if self.packed is None:
            return self.packed_for(key).make(key)
        packed = self.packed
        pieces = {k: jnp.asarray(v) for k, v in packed.pieces.items()}
        return self._device(key, packed.source_start, packed.real, pieces), self

    def spans(self, plan: Plan) -> Spans:
        """Each row's document pieces: the tokens of each piece in its cache (unused slots: none)."""
        d = plan.detail
        token_lo, length = piece_tokens(d.slot_start, d.slots, d.size)
        start = np.where(length > 0, self.packed.entry_offset[d.entry] + token_lo, 0)  # unused: nothing
        return Spans(self.packed.entry_source[d.entry], start, length)

    def provenance(self, plan: Plan) -> RowSources:
        """Each piece of a cache document, where it lands in the row (after its ``[DOC]`` marker
        when it is the document's first); no token is read."""
        spans = self.spans(plan)
        d = plan.detail
        out = from_spans(self.sources, spans.source, spans.start, spans.length, plan.example)
        used = spans.length > 0
        token_lo, _ = piece_tokens(d.slot_start, d.slots, d.size)
        out.doc[:] = np.where(used, self.packed.entry_doc[d.entry], -1)
        out.doc_start[:] = np.where(used, token_lo, 0)
        out.row_offset[:] = np.where(used, d.row_start + token_lo + 1 - d.slot_start, 0)
        return out


def _count_blocks(blocks: list[int]) -> tuple[int, np.ndarray]:
    """``(num_examples, source_start)`` of sources of ``blocks`` blocks each."""
    total = sum(blocks)
    if not 1 <= total <= 2**32 - 1:
        raise ValueError(f"{total} blocks: need 1 <= blocks <= 2**32 - 1")
    return total, np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)


def _pack_caches(caches, pack: PackSpec, key: PRNGKeyArray) -> PackedBlocks:
    """The caches' documents packed with ``key`` by the writer's ``plan_layout``, as tables."""
    layouts = [plan_layout(c.doc_lengths(), pack, key) for c in caches]
    S = pack.block_size
    packed, first, count, start_block, start_offset, size, real = ([] for _ in range(7))
    entry_doc, entry_source, entry_offset = [], [], []
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
        entry_doc.append(order)
        entry_source.append(np.full(order.shape, i, np.int32))
        entry_offset.append(cache.doc_offsets()[order])
        block_base += layout.num_blocks
        entry_base += layout.num_docs
    if block_base > 2**31 - 1 or entry_base > 2**31 - 1:
        raise ValueError(
            f"{block_base} blocks of {entry_base} documents: packing on the fly indexes them in "
            "int32; write a store (meshbatch.preblock) or split the caches"
        )
    cat = lambda parts: np.concatenate(parts).astype(np.int32)  # noqa: E731
    tables = (packed, first, count, start_block, start_offset, size)
    pieces = dict(zip(PIECE_TABLES, map(cat, tables), strict=True))
    num_examples, source_start = _count_blocks([lay.num_blocks for lay in layouts])
    return PackedBlocks(
        pieces=pieces,
        entry_doc=np.concatenate(entry_doc),
        entry_source=np.concatenate(entry_source),
        entry_offset=np.concatenate(entry_offset),
        real=np.concatenate([r[lay.block_order] for r, lay in zip(real, layouts, strict=True)]),
        layouts=layouts,
        num_examples=num_examples,
        source_start=source_start,
        spans_per_row=max(1, int(pieces["count"].max())),
    )


class MLMMasking(eqx.Module):
    """A ``BuildStage``: masked-LM masking, BERT's 80/10/10, on device, per shard.

        stage = MLMMasking(key, mask_id=260, vocab_size=257, special_ids=(257, 258, 259), mode="static")
        pipeline = Pipeline(dataset, mesh=mesh, batch_size=64, key=key, stages=(stage,))

    ``mode="dynamic"`` draws a fresh mask every time a row is read: row ``g`` of the stream
    (position ``p`` of epoch ``e``) uses ``fold_in(fold_in(key, p), e)``. ``mode="static"`` fixes
    one mask per example: ``fold_in(key, example)`` (the block id), the same in every epoch and
    wherever it lands. Neither depends on the shard or device a row is built on. The stage replaces
    ``tokens``, sets ``labels`` (the original token where masked, ``ignore_id`` elsewhere) and sets
    ``loss_mask`` to 1 exactly at the masked positions.

    Args:
        key: the masking key (an int seed or a JAX key); independent of the data key.
        mask_id: the mask token: non-negative, not one of ``special_ids`` (markers, pad) and outside
            the vocabulary ``[0, vocab_size)``, so a masked position never reads as a real token.
        vocab_size: random replacements come from ``[0, vocab_size)`` minus ``special_ids``.
        special_ids: ids never masked or drawn (``[DOC]``, ``[EOD]``, pad, ...).
        rate: the share of eligible positions selected, in ``(0, 1]``.
        mode: ``"dynamic"`` or ``"static"`` (above).
        ignore_id: the label of unselected positions.
        mask_fraction, random_fraction: of the selected positions, those replaced by ``mask_id``
            and by a random token (the rest keep theirs); ``0.8`` and ``0.1`` by default.
        mask_in_vocab: the documented exception: ``mask_id`` is the tokenizer's own mask token
            inside the vocabulary (BERT's ``[MASK]`` = 103 of 30522). It is then never drawn as a
            random replacement and a position already holding it is never selected. Refused when
            ``mask_id`` is outside the vocabulary (the exception would not apply).

    Raises:
        ValueError: ``mask_id`` negative, a special id, or inside the vocabulary without
            ``mask_in_vocab=True`` (named), or any other bad argument.
    """

    key: PRNGKeyArray
    mask_id: int = eqx.field(static=True)
    vocab_size: int = eqx.field(static=True)
    special_ids: tuple[int, ...] = eqx.field(static=True)
    rate: float = eqx.field(static=True)
    mode: str = eqx.field(static=True)
    ignore_id: int = eqx.field(static=True)
    mask_fraction: float = eqx.field(static=True)
    random_fraction: float = eqx.field(static=True)
    mask_in_vocab: bool = eqx.field(static=True)

    def __init__(
        self,
        key,
        *,
        mask_id: int,
        vocab_size: int,
        special_ids=(),
        rate: float = 0.15,
        mode: str = "dynamic",
        ignore_id: int = -100,
        mask_fraction: float = 0.8,
        random_fraction: float = 0.1,
        mask_in_vocab: bool = False,
    ):
        self.key = as_key(key)
        self.mask_id = check_int("mask_id", mask_id, low=0, high=2**31 - 1)
        self.vocab_size = check_int("vocab_size", vocab_size, low=1, high=2**31 - 1)
        if not isinstance(special_ids, list | tuple):
            raise TypeError(f"special_ids must be a list or tuple of ids (got special_ids={special_ids!r})")
        self.special_ids = tuple(sorted({check_token_id("special_ids", s) for s in special_ids}))
        self.mask_in_vocab = check_bool("mask_in_vocab", mask_in_vocab)
        _check_mask_id(self.mask_id, self.vocab_size, self.special_ids, self.mask_in_vocab)
        self.rate = check_float("rate", rate, low=0.0, high=1.0)
        if self.rate == 0.0:
            raise ValueError(f"rate must be > 0 (got {rate=}); leave the stage out to mask nothing")
        self.mode = check_choice("mode", mode, MODES)
        self.ignore_id = check_token_id("ignore_id", ignore_id)
        if 0 <= self.ignore_id < self.vocab_size or self.ignore_id in (self.mask_id, *self.special_ids):
            raise ValueError(
                f"ignore_id={ignore_id} must not be a token id (vocab_size={vocab_size}, specials)"
            )
        self.mask_fraction = check_float("mask_fraction", mask_fraction, low=0.0, high=1.0)
        self.random_fraction = check_float("random_fraction", random_fraction, low=0.0, high=1.0)
        if mask_fraction + random_fraction > 1.0:
            raise ValueError(
                f"mask_fraction + random_fraction must be <= 1 (got {mask_fraction=}, {random_fraction=})"
            )
        if self.vocab_size <= sum(1 for s in self._excluded() if 0 <= s < self.vocab_size):
            raise ValueError(f"no ordinary token to draw: every id below {vocab_size=} is special")

    def __call__(self, batch: Batch, plan) -> Batch:
        """Masks ``batch``; ``plan`` is the rows' plan (``meshbatch.datasets.protocol.Plan``)."""
        if self.mode == "dynamic":
            keys = row_keys(self.key, plan.rows.position, plan.rows.epoch)
        else:
            keys = row_keys(self.key, plan.example)
        tokens, labels = mlm_mask(
            batch.tokens,
            keys,
            rate=self.rate,
            mask_id=self.mask_id,
            vocab_size=self.vocab_size,
            special_ids=self._excluded(),
            ignore_id=self.ignore_id,
            mask_fraction=self.mask_fraction,
            random_fraction=self.random_fraction,
        )
        loss_mask = (labels != self.ignore_id).astype(jnp.int32)
        return dataclasses.replace(batch, tokens=tokens, labels=labels, loss_mask=loss_mask)

    def _excluded(self) -> tuple[int, ...]:
        """Ids never selected nor drawn: the specials, and an in-vocabulary mask token."""
        return tuple(sorted({*self.special_ids, self.mask_id})) if self.mask_in_vocab else self.special_ids


def _check_mask_id(mask_id: int, vocab_size: int, special_ids: tuple[int, ...], mask_in_vocab: bool) -> None:
    """Refuses a mask id that would read as a marker, as padding or as an ordinary token::

    mask_id=257 with special_ids (257, 258, 259)    -> a structural or pad id
    mask_id=65 with vocab_size=257                  -> an ordinary token (unless mask_in_vocab)
    """
    if mask_id in special_ids:
        raise ValueError(
            f"mask_id={mask_id} is one of special_ids={special_ids} (a structural or pad id): a masked "
            "position would read as a marker or padding"
        )
    if mask_id < vocab_size and not mask_in_vocab:
        raise ValueError(
            f"mask_id={mask_id} is an ordinary token of the vocabulary [0, {vocab_size}): use an id >= "
            f"vocab_size, or pass mask_in_vocab=True when it is the tokenizer's own mask token"
        )
    if mask_in_vocab and mask_id >= vocab_size:
        raise ValueError(
            f"mask_in_vocab=True but mask_id={mask_id} is outside the vocabulary [0, {vocab_size}); "
            "leave mask_in_vocab False"
        )
