"""``BlockSource``: preblocked rows as a flat token space the pipeline reads coalesced.

Block ``b`` is tokens ``[b * block_size, (b + 1) * block_size)``. ``prepare_read`` plans the reads
of a step's spans (``meshbatch.cache.run_reads`` issues them, with every other source's, in one
TensorStore batch); whole-row spans, the pipeline's case, are one gather straight into the
output buffer:

    source.read_blocks([7, 3])     # int32 [2, block_size]: one read (a store) or one copy per chunk

``StoreBlocks`` reads a ``meshbatch.preblock`` store's ``blocks`` array; ``ChunkBlocks`` reads
``chunk*.npy`` matrices lazily through an LRU of whole chunks, or ``chunk*.pt`` ones, the
preblocked spec's own artifacts, through ``torch.load(..., weights_only=True)`` (the optional
``meshbatch[torch]`` extra, CPU torch). A ``.pt`` file has one of two forms (``preblocked-chunks.md``):

* **preblocked**: each file one 2-D integer tensor ``[N, block_size]``. A directory of them is
  read by ``BlockDataset`` / ``open_blocks`` exactly like ``chunk*.npy`` matrices (lazily: a file's
  shape from a memory-mapped load, its rows on first use, through the same LRU);
* **legacy**: each file a list (or tuple) of 1-D integer tensors, variable-length sequences.
  They are documents: ``convert_pt_sequences(src, out)`` (``meshbatch convert-pt SRC OUT``) writes
  them once as a token cache, one row per sequence, files in natural order, which
  ``CacheBlockDataset`` packs on the fly or ``meshbatch preblock`` writes as a store.

Anything else is refused by name (``NotPlainTensors``): a pickle ``weights_only=True`` will not
load (a class, a function: code that would run on load), or tensors of another form (a dict, a
float tensor, a 3-D tensor, a list holding a non-tensor).

    chunk0.pt  tensor([[5, 6, 7, 8], [9, 0, 0, 0]])    ->  rows [5 6 7 8], [9 0 0 0]
    chunk0.pt  [tensor([5, 6, 7]), tensor([8, 9])]      ->  convert-pt: documents [5 6 7], [8 9]
"""

from __future__ import annotations

import logging
import os
import posixpath
from typing import NamedTuple

import numpy as np
import tensorstore as ts

from meshbatch.arguments import INT32_MAX, INT32_MIN
from meshbatch.cache import BlockCache, CacheIntegrityError, ReadCounters, shared_context
from meshbatch.cache.format.ledger import read_ledger
from meshbatch.cache.format.stores import kvstore_spec
from meshbatch.cache.integrity.verify import verify_default
from meshbatch.cache.read.coalesce import as_spans, coalesce_spans
from meshbatch.cache.read.reads import PendingRead, run_reads

from .block_store import (
    BLOCKS,
    HEADER_FILE,
    REAL_TOKENS,
    Header,
    chunk_files,
    detect_format,
    read_header,
    read_verifier,
)
from .pack_layout import ramp

logger = logging.getLogger(__name__)


class RowsTarget(NamedTuple):
    """One TensorStore read of whole rows into ``dest`` (what ``meshbatch.cache.run_reads`` reads)."""

    dest: np.ndarray
    source: ts.TensorStore
    what: str

    def describe(self) -> str:
        return self.what


class BlockSource:
    """Rows of ``block_size`` tokens as a flat token space; see the module docstring.

    Subclasses implement ``_plan_gather`` (any rows).
    """

    def __init__(self, path: str, num_blocks: int, block_size: int, header: Header | None):
        self.path, self.num_blocks, self.block_size, self.header = path, num_blocks, block_size, header
        self.counters = ReadCounters()

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def real_tokens(self) -> np.ndarray:
        """``int32[num_blocks]`` non-pad tokens per block (needs the pad id where not stored)."""
        raise NotImplementedError

    def read_blocks(self, indices) -> np.ndarray:
        """``int32[len(indices), block_size]``: the blocks, in the order given.

        Raises:
            IndexError: an index outside ``[0, num_blocks)``.
        """
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        bad = np.flatnonzero((indices < 0) | (indices >= self.num_blocks))
        if bad.size:
            raise IndexError(f"block {int(indices[bad[0]])} out of range for {self.num_blocks} blocks")
        out = np.empty(indices.shape[0] * self.block_size, np.int32)
        read = self.prepare_read(indices * self.block_size, np.full_like(indices, self.block_size), out, 0)
        run_reads([read])
        starts = read.span_starts[:, None] + np.arange(self.block_size)[None, :]
        return out[starts] if starts.size else out.reshape(0, self.block_size)

    def prepare_read(self, starts, lengths, out: np.ndarray, at: int) -> PendingRead:
        """Plans reading token spans, coalesced, into ``out[at:]`` (``meshbatch.cache.run_reads``
        issues it); whole-row runs are read straight into ``out``.

        Raises:
            ValueError: malformed spans or ``out`` too small.
            IndexError: a span ends past ``num_tokens``.
        """
        starts, lengths = as_spans(starts, lengths)
        ends = starts + lengths
        if ends.size and ends.max() > self.num_tokens:
            i = int(np.argmax(ends))
            raise IndexError(
                f"span {i} ends at token {int(ends[i])} > num_tokens={self.num_tokens} of {self.path}"
            )
        runs = coalesce_spans(starts, lengths)
        total = int(runs.run_offsets[-1])
        if at < 0 or at + total > out.shape[0]:
            raise ValueError(f"out has {out.shape[0]} elements; {total} tokens at {at} do not fit")
        S = self.block_size
        first = runs.run_starts // S
        count = -(-(runs.run_starts + runs.run_lengths) // S) - first  # the rows each run touches
        rows = np.repeat(first, count) + ramp(count)
        # one gather of every row: whole rows (the pipeline's case) straight into out, else aside
        whole = not np.any(runs.run_starts % S) and not np.any(runs.run_lengths % S)
        dest = out[at : at + total].reshape(-1, S) if whole else np.empty((rows.size, S), np.int32)
        targets, gathered = self._plan_gather(rows, dest)
        finishes = [gathered] if gathered is not None else []
        if not whole:  # then each run's tokens out of its rows
            skip = (np.cumsum(count) - count) * S + runs.run_starts - first * S
            index = np.repeat(skip, runs.run_lengths) + ramp(runs.run_lengths)

            def copy() -> None:
                out[at : at + total] = dest.reshape(-1)[index]

            finishes.append(copy)
        self.counters.add(
            spans_requested=starts.shape[0],
            unique_spans=runs.unique_spans,
            runs=runs.run_starts.shape[0],
            reads_issued=len(targets),
            bytes_read=rows.size * S * 4,
        )

        def finish() -> None:
            for f in finishes:
                f()

        return PendingRead(runs.span_starts + at, at + total, targets, finish if finishes else None)

    def _plan_gather(self, rows: np.ndarray, dest: np.ndarray):
        """``(targets, finish)`` that fill ``dest`` (``[len(rows), block_size]``) with ``rows``."""
        raise NotImplementedError


class StoreBlocks(BlockSource):
    """A preblocked TensorStore store (see the module docstring)."""

    def __init__(self, path: str, header: Header, *, context: ts.Context | None = None):
        context = context or shared_context()
        # a chunk that is not stored fails the read (never zeros); one rewritten on disk is re-read
        spec = lambda name: {  # noqa: E731
            "driver": "zarr3",
            "kvstore": kvstore_spec(posixpath.join(path, name)),
            "fill_missing_data_reads": False,
            "recheck_cached_data": True,
        }
        self.blocks = ts.open(spec(BLOCKS), context=context, open=True, read=True).result()
        shape = tuple(self.blocks.shape)
        if len(shape) != 2 or shape[1] != header.block_size or shape[0] < header.num_blocks:
            raise ValueError(
                f"{path}/{BLOCKS} has shape {shape}; the header says "
                f"[{header.num_blocks}, {header.block_size}]"
            )
        if self.blocks.dtype.numpy_dtype != np.int32:
            raise ValueError(f"{path}/{BLOCKS} has dtype {self.blocks.dtype.numpy_dtype}, not int32")
        self._real = ts.open(spec(REAL_TOKENS), context=context, open=True, read=True).result()
        ledger = read_ledger(path, context=context)
        if not ledger.is_finished or ledger.total_num_rows != header.num_blocks:
            raise ValueError(
                f"{path}: ledger is_finished={ledger.is_finished}, total_num_rows={ledger.total_num_rows}; "
                f"the header says {header.num_blocks} blocks (an interrupted write?)"
            )
        super().__init__(path, header.num_blocks, header.block_size, header)
        self.verifier = (
            read_verifier(path, blocks=header.num_blocks, block_size=header.block_size)
            if verify_default()
            else None
        )

    def real_tokens(self) -> np.ndarray:
        """Raises ``CacheIntegrityError`` naming the array when a chunk is missing or damaged."""
        try:
            real = self._real[: self.num_blocks].read().result()
        except ValueError as e:
            where = posixpath.join(self.path, REAL_TOKENS)
            raise CacheIntegrityError(f"{where}: cannot read blocks [0, {self.num_blocks}): {e}") from e
        if self.verifier is not None:
            self.verifier.check_real(real)
        return real.astype(np.int32)

    def _plan_gather(self, rows, dest):
        if rows.size == 0:
            return [], None
        # one read of every row: TensorStore groups them by chunk
        what = f"{self.path}: {rows.size} blocks in [{int(rows.min())}, {int(rows.max()) + 1})"
        return self._verified(rows, [RowsTarget(dest, self.blocks.oindex[rows, :], what)])

    def _verified(self, rows: np.ndarray, targets: list):
        """``targets`` plus a whole-chunk read of each chunk of ``rows`` not verified yet, and the
        check of those chunks against the writer's sums (``block_store.py``)."""
        chunks = self.verifier.pending(rows) if self.verifier is not None else []
        if not chunks:
            return targets, None
        extra = []
        for c in chunks:
            lo, hi = self.verifier.rows(c)
            buffer = np.empty((hi - lo, self.block_size), np.int32)
            extra.append(RowsTarget(buffer, self.blocks[lo:hi, :], f"{self.path}: blocks [{lo}, {hi})"))

        def verify() -> None:
            for c, target in zip(chunks, extra, strict=True):
                self.verifier.check(c, target.dest)

        return targets + extra, verify


class ChunkBlocks(BlockSource):
    """``chunk*.npy`` matrices, opened lazily: only their headers are read until rows are asked
    for; whole chunks are then loaded and kept in a ``BlockCache`` LRU (``cache_bytes``), so many
    small chunk files are not reopened for every read.
    """

    def __init__(
        self, path: str, header: Header | None, *, pad_id: int | None = None, cache_bytes: int = 1 << 28
    ):
        self.files = chunk_files(path)
        if not self.files:
            raise ValueError(f"no chunk*.npy files in {path}")
        kinds = {os.path.splitext(f)[1] for f in self.files}
        if len(kinds) > 1:
            raise ValueError(f"{path} mixes chunk*.npy and chunk*.pt files; keep one format in a directory")
        rows, width = [], None
        for file in self.files:
            array = _load_chunk(file, header_only=True)  # no data read
            if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
                raise ValueError(
                    f"{file} holds a {array.dtype} array of shape {array.shape}; need [rows, block]"
                )
            if width is not None and array.shape[1] != width:
                raise ValueError(f"{file} has rows of {array.shape[1]} tokens; the first chunk has {width}")
            width = array.shape[1]
            rows.append(array.shape[0])
        self.row_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self.cache = BlockCache(cache_bytes)
        self.pad_id = header.pad_id if header is not None else pad_id
        super().__init__(path, int(self.row_starts[-1]), int(width), header)
        if header is not None and (header.block_size, header.num_blocks) != (
            self.block_size,
            self.num_blocks,
        ):
            raise ValueError(
                f"{path}: chunks hold [{self.num_blocks}, {self.block_size}], the header says "
                f"[{header.num_blocks}, {header.block_size}]"
            )

    def chunk(self, i: int) -> np.ndarray:
        """Chunk ``i`` as an int32 array, through the LRU."""
        array = self.cache.get(i)
        if array is None:
            array = int32_ids(_load_chunk(self.files[i]), self.files[i], "rows")
            self.cache.put(i, array)
        return array

    def real_tokens(self) -> np.ndarray:
        file = os.path.join(self.path, "real_tokens.npy")
        if os.path.isfile(file):
            return np.load(file).astype(np.int32)
        if self.pad_id is None:
            raise ValueError(f"{self.path} has no real_tokens.npy and no pad id to count them with")
        logger.info("counting non-pad tokens of %d blocks in %s", self.num_blocks, self.path)
        return np.concatenate(
            [np.count_nonzero(self.chunk(i) != self.pad_id, axis=1) for i in range(len(self.files))]
        ).astype(np.int32)

    def _plan_gather(self, rows, dest):
        def finish() -> None:
            chunk = np.searchsorted(self.row_starts, rows, side="right") - 1
            for i in np.unique(chunk).tolist():
                mine = chunk == i
                dest[mine] = self.chunk(i)[rows[mine] - self.row_starts[i]]

        return [], finish


def _load_chunk(file: str, *, header_only: bool = False) -> np.ndarray:
    """A ``chunk*.npy`` matrix, or a ``chunk*.pt`` one through ``torch.load(weights_only=True)``
    (module docstring); ``header_only``: memory-mapped, nothing read but the shape (a view of the
    mapped storage for ``.pt``).

    Raises:
        NotPlainTensors: a ``.pt`` file that is not plain tensors, or the legacy form (pointing to
            ``convert-pt``).
    """
    if not file.endswith(".pt"):
        return np.load(file, mmap_mode="r" if header_only else None)
    obj = load_pt(file, mmap=header_only)
    if isinstance(obj, list):
        raise NotPlainTensors(
            f"{file} holds a list of {len(obj)} sequences (the legacy form), not a [rows, block_size] "
            "matrix: convert them once into a token cache (meshbatch convert-pt SRC OUT) and read that"
        )
    return obj.numpy()


def int32_ids(array: np.ndarray, what: str, name: str) -> np.ndarray:
    """``array`` (integer ids, ``what``) as int32, refusing by position an id that does not fit: it
    would wrap to a plausible one (``2**32 + 5 -> 5``)."""
    wide = (array < INT32_MIN) | (array > INT32_MAX)
    if wide.any():
        at = tuple(int(i) for i in np.argwhere(wide)[0])
        raise ValueError(
            f"{what} holds ids that do not fit int32 ({name}[{', '.join(map(str, at))}] = {array[at]})"
        )
    return array.astype(np.int32, copy=False)


def open_blocks(path: str, *, pad_id: int | None = None, cache_bytes: int = 1 << 28):
    """Opens a preblocked store or a ``chunk*.npy`` directory as a ``BlockSource``.

    Raises:
        FileNotFoundError: no such directory.
        ValueError: a jagged token cache or anything else (named), or an inconsistent store.
    """
    kind = detect_format(path)
    if kind == "levanter":
        raise ValueError(
            f"{path} is a jagged token cache, not preblocked data (see BlockDataset's legacy mode)"
        )
    header = read_header(path)
    if kind == "store":
        if header is None:
            raise ValueError(f"{path} has {BLOCKS}/ but no {HEADER_FILE}")
        return StoreBlocks(path, header)
    return ChunkBlocks(path, header, pad_id=pad_id, cache_bytes=cache_bytes)


class NotPlainTensors(ValueError):
    """A ``.pt`` file that is not plain integer tensors in one of the two chunk forms."""


def load_pt(file: str, *, mmap: bool = False):
    """The contents of a ``chunk*.pt`` file: a 2-D ``torch.Tensor`` (preblocked) or a list of 1-D
    tensors (legacy), loaded with ``weights_only=True`` (``mmap``: storages mapped, not read).

    Raises:
        ImportError: torch is not installed (naming the extra).
        NotPlainTensors: anything but integer tensors in those two forms, naming the file.
    """
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "reading chunk*.pt files needs torch: pip install 'meshbatch[torch]' (the CPU build is enough)"
        ) from e
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # weights_only's refusal is an UnpicklingError; a torn file a RuntimeError
        raise NotPlainTensors(
            f"{file}: torch.load(weights_only=True) refused it, so it is not plain tensors "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e!r})"
        ) from e

    def integer(t) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and not t.is_floating_point()
            and not t.is_complex()
            and t.dtype != torch.bool
        )

    if isinstance(obj, torch.Tensor):
        if obj.ndim != 2 or not integer(obj):
            raise NotPlainTensors(
                f"{file} holds a {obj.dtype} tensor of shape {tuple(obj.shape)}; a chunk is an integer "
                "[rows, block_size] tensor or a list of 1-D integer tensors"
            )
        return obj
    if isinstance(obj, list | tuple):
        for i, t in enumerate(obj):
            if not (integer(t) and t.ndim == 1):
                what = (
                    f"a {t.dtype} tensor of shape {tuple(t.shape)}"
                    if isinstance(t, torch.Tensor)
                    else repr(type(t))
                )
                raise NotPlainTensors(f"{file}: item {i} of its list is {what}, not a 1-D integer tensor")
        return list(obj)
    raise NotPlainTensors(
        f"{file} holds a {type(obj).__name__}; a chunk is an integer [rows, block_size] tensor or a list of "
        "1-D integer tensors"
    )


def convert_pt_sequences(src: str, out: str, *, if_exists: str = "error") -> int:
    """Writes the legacy ``chunk*.pt`` sequences of ``src`` as a token cache at ``out`` (one row per
    sequence, files in natural order); returns the rows written.

    Raises:
        FileNotFoundError: no ``chunk*.pt`` files in ``src``.
        NotPlainTensors: a file that is not the legacy form (a matrix, or not plain tensors).
        ValueError: ids outside int32.
    """
    from meshbatch.cache import CacheWriter

    files = [f for f in chunk_files(src) if f.endswith(".pt")]
    if not files:
        raise FileNotFoundError(f"no chunk*.pt files in {src}")
    rows = 0
    with CacheWriter(out, if_exists=if_exists) as writer:
        for file in files:
            obj = load_pt(file)
            if not isinstance(obj, list):
                raise NotPlainTensors(
                    f"{file} holds a [rows, block_size] matrix (the preblocked form), not a list of "
                    "sequences: BlockDataset reads such a directory as it is"
                )
            docs = [int32_ids(t.numpy(), f"{file}: sequence {i}", "tokens") for i, t in enumerate(obj)]
            writer.write(docs)
            rows += len(docs)
            logger.info("%s: %d sequences", os.path.basename(file), len(docs))
    return rows
