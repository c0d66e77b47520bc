"""Packed examples of a chat or supervised cache: several variable-length examples per row, each
with its own loss mask, segment id and positions, built in the mesh.

``PackedDataset(path, seq_len)`` reads a Levanter chat cache (``input_ids`` + ``assistant_masks``)
or supervised cache (``input_ids`` + ``sources_len``). The packing plan (which examples share a
row, in what order) is a jitted kernel (``meshbatch.kernels.greedy_rows`` / ``first_fit_rows``)
over the examples' lengths, run once by ``make`` for the pipeline's key, the same on every process;
a packed row is then an example of the stream like any window, shuffled by ``ShuffleSpec``:

    make    lengths -> (shuffle of examples) -> packing -> members, row_start   (once, per key)
    plan    row position -> packed row r (ShuffleSpec) -> members[row_start[r] : row_start[r + 1]]
    spans   each member's tokens (and, chat, its assistant_masks): one span each, read coalesced
    build   packed_rows: tokens, loss_mask, segment_ids (+ positions, cu_seqlens on request)

A trace: ``seq_len=8``, a chat cache of examples of 5, 4, 3, 2, 6 tokens, ``compat="levanter"``
(greedy in cache order), ``shuffle=ShuffleSpec("none")``:

    packing   rows [0, 1, 1, 2, 2]: members [0 | 1 2 | 3 4], row_start [0, 1, 3, 5, 5, 5]
    plan      row position 1 -> packed row 1 -> member [1, 2, 0 ...], length [4, 3, 0 ...]
    spans     input_ids rows 1 and 2, assistant_masks rows 1 and 2 (4 spans, 2 runs)
    build     tokens = [e1 e1 e1 e1 e2 e2 e2 pad], segment_ids = [1 1 1 1 2 2 2 -1]

Policies: ``compat="levanter"`` is Levanter's ``GreedyPrepackedDataset`` (next fit in cache order,
``max_segments`` examples a row, its slicing of long examples and its loss masks) bit for bit; the
default is first fit over windows of ``window`` examples of a keyed shuffle of the examples (tighter
rows); ``pack=False`` puts one example in each row, padded (marin#7086's unpacked SFT).
"""

from __future__ import annotations

import logging
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

import meshbatch.kernels as K
from meshbatch.arguments import as_key, check_bool, check_choice, check_int, check_token_id
from meshbatch.cache import DEFAULT_CHUNK_SIZE
from meshbatch.kernels import Batch
from meshbatch.shuffles.shuffle_spec import ShuffleSpec, permutation

from ..protocol import Content, Dataset, DeviceDataset, Plan, Rows, Spans, replace
from ..provenance import RowSources, from_spans
from .packed_sources import FORMATS, Examples, PackedDataError, open_examples

logger = logging.getLogger(__name__)

FULL_SHUFFLE = ShuffleSpec()
PACKING_TAG = 0x50414344  # "PACD": the examples' shuffle before packing uses fold_in(key, PACKING_TAG)
SliceStrategy = Literal["left", "right", "raise"]
SLICE_STRATEGIES = ("left", "right", "raise")
LEVANTER_SLICE = {"chat": "left", "supervised": "right"}  # Levanter's datasets' defaults
Compat = Literal["levanter"] | None


class PackedPlan(eqx.Module):
    """Each planned row's members (``[n, max_segments]``; unused slots have length 0).

    Attributes:
        member: the example (cache row) in each slot.
        length: its kept tokens (at most ``seq_len``; 0: unused).
        cut: tokens dropped from its start (``slice_strategy="right"``).
        sources_len: its prompt tokens (supervised; 0 for chat).
    """

    member: Int[Array, "n segs"]
    length: Int[Array, "n segs"]
    cut: Int[Array, "n segs"]
    sources_len: Int[Array, "n segs"]


class PackedBuild(eqx.Module):
    """The build of packed rows (configuration only): equal for any cache of the same format."""

    seq_len: int = eqx.field(static=True)
    chat: bool = eqx.field(static=True)
    mask_prompt: bool = eqx.field(static=True)
    rule: str = eqx.field(static=True)
    pad_id: int = eqx.field(static=True)
    attention_metadata: bool = eqx.field(static=True)

    def __call__(self, plan: Plan, content: Content) -> Batch:
        detail: PackedPlan = plan.detail
        rows = K.packed_rows(
            content.tokens,
            content.offsets,
            detail.member,
            detail.length,
            detail.cut,
            None if self.chat else detail.sources_len,
            seq_len=self.seq_len,
            chat=self.chat,
            mask_prompt=self.mask_prompt,
            rule=self.rule,
            pad_id=self.pad_id,
        )
        extra = dict(positions=rows.positions, cu_seqlens=rows.cu_seqlens) if self.attention_metadata else {}
        return Batch(tokens=rows.tokens, loss_mask=rows.loss_mask, segment_ids=rows.segment_ids, **extra)


class PackedDevice(DeviceDataset):
    """The device half of ``PackedDataset``: the packed rows' order and the packing's tables.

    Attributes:
        shuffle_spec: the order of packed rows (static).
        shuffle: its module for the key, or ``None``.
        members, row_start: the packing's ``PackTables``.
        lengths: ``int32[n]`` tokens per example (untruncated).
        sources_len: ``int32[n]`` prompt tokens per example (zeros for chat).
        max_segments: member slots per row (static).
        keep_end: long examples keep their last ``seq_len`` tokens (``slice_strategy="right"``).
        row_build: the build's configuration.
    """

    shuffle_spec: ShuffleSpec = eqx.field(static=True)
    shuffle: eqx.Module | None
    members: Int[Array, " n"]
    row_start: Int[Array, " n1"]
    lengths: Int[Array, " n"]
    sources_len: Int[Array, " n"]
    max_segments: int = eqx.field(static=True)
    keep_end: bool = eqx.field(static=True)
    row_build: PackedBuild

    @property
    def seq_len(self) -> int:
        return self.row_build.seq_len

    def plan(self, rows: Rows, state=None) -> tuple[Plan, None]:
        """Each row's packed row (the shuffle of its position) and that row's members."""
        packed = self.shuffle_spec.apply(self.shuffle, rows.position, rows.epoch)
        index = packed.astype(jnp.int32)
        lo = self.row_start[index][:, None]
        hi = self.row_start[index + 1][:, None]
        at = lo + jnp.arange(self.max_segments, dtype=jnp.int32)[None, :]
        used = at < hi
        member = jnp.where(used, self.members[jnp.minimum(at, self.members.shape[0] - 1)], 0)
        full = self.lengths[member]
        seq_len = jnp.int32(self.seq_len)
        length = jnp.where(used, jnp.minimum(full, seq_len), 0)
        cut = jnp.where(used & (full > seq_len), full - seq_len, 0) if self.keep_end else jnp.zeros_like(full)
        detail = PackedPlan(
            member=member, length=length, cut=cut, sources_len=jnp.where(used, self.sources_len[member], 0)
        )
        source = jnp.zeros(packed.shape, jnp.int32)
        return Plan(rows=rows, source=source, example=packed, detail=detail), None

    def build(self, plan: Plan, content: Content) -> Batch:
        return self.row_build(plan, content)

    def builder(self) -> PackedBuild:
        return self.row_build

    def real_tokens(self, plan: Plan) -> Int[Array, " n"]:
        """The examples' kept tokens in each row (padding excluded)."""
        return jnp.sum(plan.detail.length, axis=1, dtype=jnp.int32)


class PackedDataset(Dataset):
    """Packed examples of a Levanter chat or supervised cache (see the module docstring).

    Args:
        path: the cache root (holding ``shard_ledger.json`` and the fields).
        format: ``"chat"`` (``assistant_masks``) or ``"supervised"`` (``sources_len``); ``None``
            detects it from the fields present.
        pack: ``False``: one example per row, padded.
        compat: ``"levanter"``: Levanter's ``GreedyPrepackedDataset`` packing in cache order and
            its loss masks, bit for bit; ``None``: first fit over shuffled windows and meshbatch's
            loss mask (no loss on each example's last token).
        max_segments: examples per row at most (Levanter's ``max_segments_per_example``); also
            the static size of ``cu_seqlens`` (``min(max_segments, seq_len) + 1`` entries: a row
            never holds more examples than tokens).
        window: examples packed together by first fit (default policy; ``None``: 512).
        decreasing: first fit takes each window's examples largest first (default policy;
            ``None``: ``False``).
        shuffle_examples: shuffle the examples (keyed) before packing (default policy; ``None``:
            ``True``).
            These three configure the first-fit packing: given with ``compat="levanter"`` or
            ``pack=False`` (which do not use it) they are refused.
        shuffle: the order of packed rows in each epoch.
        slice_strategy: an example longer than ``seq_len``: ``"left"`` keeps its first tokens,
            ``"right"`` its last, ``"raise"`` refuses the dataset naming the row; ``None``:
            Levanter's rule for the format (chat ``"left"``, supervised ``"right"``).
        mask_prompt: loss only on assistant tokens (chat) / completion tokens (supervised);
            Levanter's ``mask_user_turns`` / ``mask_inputs``.
        attention_metadata: also build ``positions`` and ``cu_seqlens``.
        pad_id: the token of padding positions (Levanter pads with 0).

    Raises:
        TypeError, ValueError: a bad argument, named.
        PackedDataError: damaged examples (naming the cache and the row), or an example longer
            than ``seq_len`` with ``slice_strategy="raise"``.
    """

    seq_len: int
    pack: bool
    compat: Compat
    max_segments: int
    window: int
    decreasing: bool
    shuffle_examples: bool
    shuffle_spec: ShuffleSpec
    mask_prompt: bool
    attention_metadata: bool
    pad_id: int
    examples: Examples
    format: str
    slice_strategy: SliceStrategy
    segments: int  # member slots per row
    spans_per_row: int
    max_row_tokens: int
    packing: K.PackTables | None  # numpy, on the host; ``None`` until made for a key (keyed packing)

    def __init__(
        self,
        path: str,
        seq_len: int,
        *,
        format: Literal["chat", "supervised"] | None = None,
        pack: bool = True,
        compat: Compat = None,
        max_segments: int = 64,
        window: int | None = None,
        decreasing: bool | None = None,
        shuffle_examples: bool | None = None,
        shuffle: ShuffleSpec = FULL_SHUFFLE,
        slice_strategy: SliceStrategy | None = None,
        mask_prompt: bool = True,
        attention_metadata: bool = False,
        pad_id: int = 0,
    ):
        if not isinstance(path, str):
            raise TypeError(f"path must be a str, a cache root (got path={path!r})")
        self.seq_len = check_int("seq_len", seq_len, low=1, high=2**30)
        check_choice("format", format, (*FORMATS, None))
        self.pack = check_bool("pack", pack)
        self.compat = check_choice("compat", compat, ("levanter", None))
        self.max_segments = check_int("max_segments", max_segments, low=1, high=2**16)
        first_fit = {"window": window, "decreasing": decreasing, "shuffle_examples": shuffle_examples}
        given = {k: v for k, v in first_fit.items() if v is not None}
        if given and (compat == "levanter" or pack is False):
            policy = (
                "compat='levanter' packs greedily in cache order" if compat else "pack=False packs nothing"
            )
            raise ValueError(
                f"{policy}: {', '.join(f'{k}={v!r}' for k, v in given.items())} configure the default "
                "first-fit packing only"
            )
        self.window = check_int("window", 512 if window is None else window, low=1, high=1 << 16)
        self.decreasing = check_bool("decreasing", False if decreasing is None else decreasing)
        self.shuffle_examples = check_bool(
            "shuffle_examples", True if shuffle_examples is None else shuffle_examples
        )
        if not isinstance(shuffle, ShuffleSpec):
            raise TypeError(f"shuffle must be a ShuffleSpec (got shuffle={shuffle!r})")
        self.shuffle_spec = shuffle
        check_choice("slice_strategy", slice_strategy, (*SLICE_STRATEGIES, None))
        self.mask_prompt = check_bool("mask_prompt", mask_prompt)
        self.attention_metadata = check_bool("attention_metadata", attention_metadata)
        self.pad_id = check_token_id("pad_id", pad_id)
        self.examples: Examples = open_examples(path, format)
        self.format = self.examples.format
        self.slice_strategy = slice_strategy or LEVANTER_SLICE[self.format]
        n = self.examples.num_examples
        if n > 2**31 - 1:
            raise ValueError(f"{n} examples: a packed dataset indexes them in int32; split the cache")
        lengths = self.examples.lengths
        if self.slice_strategy == "raise" and (lengths > self.seq_len).any():
            row = int(np.flatnonzero(lengths > self.seq_len)[0])
            raise PackedDataError(
                f"{self.format} cache {self.examples.path}: row {row} has {int(lengths[row])} tokens, longer "
                f"than seq_len={self.seq_len} (slice_strategy='raise'; 'left' or 'right' slices it)"
            )
        # A row never holds more than seq_len examples (each has a token): as many slots at most.
        # (For Levanter's supervised packing that is also its sources_len leaf's room.)
        self.segments = 1 if not pack else min(self.max_segments, self.seq_len)
        self.sources = (self.examples.tokens,) + ((self.examples.masks,) if self.format == "chat" else ())
        self.spans_per_row = self.segments * len(self.sources)
        self.max_row_tokens = self.seq_len * len(self.sources)
        keyed = self.pack and self.compat is None and self.shuffle_examples  # the default's shuffle
        self.packing = None if keyed else self._pack(None)

    @property
    def num_examples(self) -> int:
        """The packed rows (known once packed: at construction, or for a key by ``make``)."""
        if self.packing is None:
            raise AttributeError(
                "the packed rows depend on the key (shuffle_examples=True): num_examples is known on "
                "the dataset PackedDataset.make(key) returns (dataset.make(key)[1].num_examples)"
            )
        return int(self.packing.num_rows)

    # -- packing --------------------------------------------------------------------------------

    def _pack(self, key: PRNGKeyArray | None) -> K.PackTables:
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            return jax.device_get(self._pack_on_cpu(key))

    def _pack_on_cpu(self, key: PRNGKeyArray | None) -> K.PackTables:
        n = self.examples.num_examples
        seq_len = jnp.int32(self.seq_len)
        lengths = jnp.asarray(np.minimum(self.examples.lengths, 2**31 - 1).astype(np.int32))
        if not self.pack:  # example i alone in row i
            return K.pack_tables(jnp.arange(n, dtype=jnp.int32), lengths)
        if self.compat == "levanter":
            rows = K.greedy_rows(lengths, seq_len, max_segments=self.segments)
            return K.pack_tables(rows, lengths)
        order = jnp.arange(n, dtype=jnp.uint32)
        if key is not None:
            order = permutation("feistel", n, jax.random.fold_in(as_key(key), PACKING_TAG))(order)
        order = order.astype(jnp.int32)
        sizes = jnp.minimum(lengths[order], seq_len)
        rows = K.first_fit_rows(
            sizes, seq_len, max_segments=self.segments, window=self.window, decreasing=self.decreasing
        )
        tables = K.pack_tables(rows, sizes, decreasing=self.decreasing)
        return K.PackTables(
            members=order[tables.members], row_start=tables.row_start, num_rows=tables.num_rows
        )

    def fill(self) -> float:
        """Real tokens over slots of the packed rows (packing efficiency); needs the packing."""
        if self.packing is None:
            raise ValueError("the packing depends on the key: call fill() on dataset.make(key)[1]")
        kept = np.minimum(self.examples.lengths, self.seq_len).sum()
        return float(kept) / (int(self.packing.num_rows) * self.seq_len)

    # -- the protocol ---------------------------------------------------------------------------

    def make(self, key: PRNGKeyArray) -> tuple[PackedDevice, PackedDataset]:
        """The packed rows' order for ``key`` and the packing's tables; the host half is a new
        value packed for ``key`` when the packing depends on it."""
        if self.packing is None:
            host = replace(self, packing=self._pack(key))
            logger.info(
                "packed %d %s examples into %d rows of %d tokens (fill %.4f)",
                self.examples.num_examples, self.format, host.num_examples, self.seq_len, host.fill(),
            )  # fmt: skip
            return host.make(key)
        chunk = max(1, DEFAULT_CHUNK_SIZE // self.seq_len)
        shuffle = self.shuffle_spec.create(self.num_examples, key, default_block=chunk)
        n = self.examples.num_examples
        sources_len = self.examples.sources_len if self.format == "supervised" else np.zeros(n, np.int32)
        build = PackedBuild(
            seq_len=self.seq_len,
            chat=self.format == "chat",
            mask_prompt=self.mask_prompt,
            rule="levanter" if self.compat == "levanter" else "meshbatch",
            pad_id=self.pad_id,
            attention_metadata=self.attention_metadata,
        )
        return PackedDevice(
            shuffle_spec=self.shuffle_spec,
            shuffle=shuffle,
            members=jnp.asarray(self.packing.members, jnp.int32),
            row_start=jnp.asarray(self.packing.row_start, jnp.int32),
            lengths=jnp.asarray(np.minimum(self.examples.lengths, 2**31 - 1).astype(np.int32)),
            sources_len=jnp.asarray(sources_len.astype(np.int32)),
            max_segments=self.segments,
            keep_end=self.slice_strategy == "right",
            row_build=build,
        ), self

    def spans(self, plan: Plan) -> Spans:
        """Each member's kept tokens; for chat, then the same ranges of ``assistant_masks``."""
        detail: PackedPlan = plan.detail
        member = np.asarray(detail.member, np.int64)
        start = self.examples.offsets[member] + np.asarray(detail.cut, np.int64)
        length = np.asarray(detail.length, np.int64)
        start = np.where(length > 0, start, 0)
        k = len(self.sources)
        source = np.repeat(np.arange(k, dtype=np.int32), self.segments)[None, :]
        return Spans(
            np.broadcast_to(source, (member.shape[0], self.spans_per_row)).copy(),
            np.tile(start, (1, k)),
            np.tile(length, (1, k)),
        )

    def provenance(self, plan: Plan) -> RowSources:
        """Each row's examples: one ``input_ids`` span per member, back to back from the row's
        start (the ``assistant_masks`` spans a chat row also reads are supervision, not tokens)."""
        spans = self.spans(plan)
        k = self.segments
        return from_spans(
            self.sources, spans.source[:, :k], spans.start[:, :k], spans.length[:, :k], plan.example
        )

    def __repr__(self) -> str:
        return (
            f"PackedDataset({self.examples.path!r}, format={self.format!r}, seq_len={self.seq_len}, "
            f"pack={self.pack}, compat={self.compat!r}, max_segments={self.max_segments}, "
            f"window={self.window}, decreasing={self.decreasing}, "
            f"shuffle_examples={self.shuffle_examples}, "
            f"shuffle={self.shuffle_spec}, slice_strategy={self.slice_strategy!r}, "
            f"mask_prompt={self.mask_prompt}, attention_metadata={self.attention_metadata}, "
            f"pad_id={self.pad_id})"
        )
