"""Causal-LM windows over a token cache: Levanter's ``TokenSeqDataset`` + ``CausalLmDataset``.

Example ``i`` is tokens ``[i * seq_len, (i + 1) * seq_len)`` of the cache's flat token stream
(document boundaries ignored, the tail that does not fill a window dropped). A shuffle maps each
position of an epoch to an example; the host reads the examples' token spans, and the build kernel
turns them into ``Batch`` rows with Levanter's causal loss mask and EOS-derived segment ids.

    cache tokens = [0 .. 9], seq_len = 4:  examples [0 1 2 3], [4 5 6 7]   (8, 9 dropped)
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, UInt32

from meshbatch.kernels import Batch
from meshbatch.kernels.causal import causal_lm_batch
from meshbatch.kernels.permutation import COMPATS, KINDS

from .shuffle import block_shuffle, era_shuffle, permutation

Strategy = Literal["none", "full", "era", "block"]


@dataclasses.dataclass(frozen=True)
class ShuffleSpec:
    """How a dataset orders its examples within each epoch.

    Attributes:
        strategy: ``"none"`` (cache order), ``"full"`` permutation, ``"era"`` or ``"block"``.
        kind: ``"feistel"`` or ``"linear"``.
        compat: ``"levanter"`` for Levanter's exact orders, ``None`` for the strong default.
        era_length: examples per era (``strategy="era"``).
        io_block_size: examples per block (``strategy="block"``); ``None`` aligns a block with
            one read chunk of the cache (256 Ki tokens / seq_len).
        window_blocks: blocks mixed together (``strategy="block"``).
        reshuffle_each_epoch: epoch ``e >= 1`` uses ``fold_in(key, e)``; otherwise every epoch
            repeats epoch 0's order.
    """

    strategy: Strategy = "full"
    kind: Literal["feistel", "linear"] = "feistel"
    compat: Literal["levanter"] | None = None
    era_length: int | None = None
    io_block_size: int | None = None
    window_blocks: int = 8
    reshuffle_each_epoch: bool = False

    def __post_init__(self):
        if self.strategy not in ("none", "full", "era", "block"):
            raise ValueError(f"strategy must be none, full, era or block (got strategy={self.strategy!r})")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} (got kind={self.kind!r})")
        if self.compat not in COMPATS:
            raise ValueError(f"compat must be one of {COMPATS} (got compat={self.compat!r})")
        if self.strategy == "era" and self.era_length is None:
            raise ValueError("strategy='era' needs era_length (got era_length=None)")
        if self.strategy != "era" and self.era_length is not None:
            raise ValueError(f"era_length={self.era_length} only applies to strategy='era'")
        if self.strategy != "block" and (self.io_block_size is not None or self.window_blocks != 8):
            raise ValueError("io_block_size and window_blocks only apply to strategy='block'")
        if self.strategy == "none" and (self.reshuffle_each_epoch or self.kind != "feistel" or self.compat):
            raise ValueError(
                "strategy='none' does not shuffle: kind, compat and reshuffle_each_epoch do not apply"
            )

    def create(self, length: int, key: PRNGKeyArray, *, read_chunk_examples: int):
        """The shuffle module for ``length`` examples, or ``None`` for ``strategy="none"``."""
        common = dict(key=key, kind=self.kind, compat=self.compat)
        if self.strategy == "none":
            return None
        if self.strategy == "full":
            return permutation(self.kind, length, key, compat=self.compat)
        if self.strategy == "era":
            return era_shuffle(length, era_length=self.era_length, **common)
        block = self.io_block_size if self.io_block_size is not None else read_chunk_examples
        return block_shuffle(length, io_block_size=block, window_blocks=self.window_blocks, **common)


# Levanter's DEFAULT_CHUNK_SIZE: tokens per zarr read chunk of a cache's data array.
READ_CHUNK_TOKENS = 256 * 1024


class CausalLMDataset:
    """Fixed windows of ``seq_len`` tokens from a token source, shuffled per ``ShuffleSpec``.

    Args:
        source: a ``TokenCache`` (or anything with ``num_tokens`` and ``read_runs``).
        seq_len: tokens per example.
        shuffle: the ordering; ``ShuffleSpec(strategy="none")`` keeps cache order.
        eos_id: token that ends a document (segment ids break after it); ``None``: one segment.
        ignore_id: token never used as a target; ``None``: only the last position is masked.
    """

    fetches = True

    def __init__(
        self,
        source,
        seq_len: int,
        *,
        shuffle: ShuffleSpec = ShuffleSpec(),
        eos_id: int | None = None,
        ignore_id: int | None = None,
    ):
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
            raise ValueError(f"seq_len must be a positive int (got seq_len={seq_len!r})")
        num_examples = int(source.num_tokens) // seq_len
        if num_examples < 1:
            raise ValueError(
                f"the source holds {source.num_tokens} tokens: not one window of seq_len={seq_len}"
            )
        if num_examples > 2**32 - 1:
            raise ValueError(
                f"{num_examples} examples exceed 2**32 - 1; use a longer seq_len or split the cache"
            )
        self.source = source
        self.seq_len = seq_len
        self.num_examples = num_examples
        self.shuffle_spec = shuffle
        self.eos_id = eos_id
        self.ignore_id = ignore_id

    def plan_state(self, key: PRNGKeyArray):
        """What the plan kernel needs besides positions: the shuffle module (or ``None``)."""
        chunk = max(1, READ_CHUNK_TOKENS // self.seq_len)
        return self.shuffle_spec.create(self.num_examples, key, read_chunk_examples=chunk)

    def plan(self, state, positions: UInt32[Array, " n"], epochs: UInt32[Array, " n"]) -> UInt32[Array, " n"]:
        """The example each row reads: ``shuffle(position)`` (with its epoch if reshuffling)."""
        if state is None:
            return positions
        if self.shuffle_spec.reshuffle_each_epoch:
            return state(positions, epoch=epochs)
        return state(positions)

    def spans(self, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global token spans of the planned examples (int64: offsets may exceed 2**32)."""
        starts = examples.astype(np.int64) * self.seq_len
        return starts, np.full(starts.shape, self.seq_len, np.int64)

    def build(self, state, content: Int[Array, "rows seq"], planned) -> Batch:
        """Rows of the batch from their token windows."""
        del state, planned
        return causal_lm_batch(content, eos_id=self.eos_id, ignore_id=self.ignore_id)

    def __repr__(self) -> str:
        return (
            f"CausalLMDataset(examples={self.num_examples}, seq_len={self.seq_len}, "
            f"shuffle={self.shuffle_spec}, eos_id={self.eos_id}, ignore_id={self.ignore_id})"
        )
