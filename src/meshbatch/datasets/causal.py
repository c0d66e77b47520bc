"""Causal-LM windows over a token cache: Levanter's ``TokenSeqDataset`` + ``CausalLmDataset``.

Example ``i`` is tokens ``[i * seq_len, (i + 1) * seq_len)`` of the cache's flat token stream
(document boundaries ignored, the tail that does not fill a window dropped). A shuffle maps each
position of an epoch to an example; the host reads the examples' token spans, and the build kernel
cuts each row's window out of the fetched buffer and gives it Levanter's causal loss mask and
EOS-derived segment ids.

    cache tokens = [0 .. 9], seq_len = 4:  examples [0 1 2 3], [4 5 6 7]   (8, 9 dropped)
    rows position = [1, 0]  ->  example = [1, 0]  ->  spans (4, 4), (0, 4)  ->  one read [0, 8)

The dataset is a value: ``make(key)`` makes ``CausalDevice`` (the shuffle's tables, the window
build's configuration); the dataset itself reads spans on the host and is never changed.

Quick start: over a cache still being written (``TokenCache.open(..., require_finished=False)``)
the dataset serves the windows already committed and waits (Levanter's
``wait_until_len_at_least``) for the ones a step needs. Cache order needs only those windows; an
era shuffle needs their whole eras (era ``e`` is permuted as soon as windows up to ``(e + 1) *
era_length`` are committed: the same order the finished cache gives). A full or block shuffle
needs the final length, and is refused until the cache is finished. Once the cache is finished,
``wait_for`` returns the final dataset, a new value the pipeline makes again for its key.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from meshbatch.arguments import check_int, check_token_id
from meshbatch.cache import DEFAULT_CHUNK_SIZE, poll_until
from meshbatch.kernels import Batch, causal_lm_batch, gather_windows
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

from .protocol import (
    Content,
    Dataset,
    DeviceDataset,
    Plan,
    Rows,
    Spans,
    TokenSource,
    check_cache,
    gather_members,
)

logger = logging.getLogger(__name__)
MAX_EXAMPLES = 2**32 - 1
FULL_SHUFFLE = ShuffleSpec()
GROWING_ORDERS = ("none", "era")  # orders defined before the final length is known


class WindowBuild(eqx.Module):
    """The build of causal windows: each row's ``seq_len`` tokens from the fetched buffer, with
    Levanter's causal loss mask and EOS-derived segment ids. Equal for windows of any cache, so a
    mixture of caches builds them in one call."""

    seq_len: int = eqx.field(static=True)
    eos_id: int | None = eqx.field(static=True)
    ignore_id: int | None = eqx.field(static=True)

    def __call__(self, plan: Plan, content: Content) -> Batch:
        windows = gather_windows(content.tokens, content.offsets[:, 0], width=self.seq_len)
        return causal_lm_batch(windows, eos_id=self.eos_id, ignore_id=self.ignore_id)


class CausalDevice(DeviceDataset):
    """The device half of ``CausalLMDataset``: the shuffle (``None`` for cache order) and the build.

    Attributes:
        shuffle_spec: the ordering (static).
        shuffle: the shuffle module ``shuffle_spec.create`` made for the key, or ``None``.
        window: the window build (static configuration only).
    """

    shuffle_spec: ShuffleSpec = eqx.field(static=True)
    shuffle: eqx.Module | None
    window: WindowBuild
    # A plan of up to this many rows (a shuffle of one batch of positions, once per step, on the
    # host) compiles at XLA's lowest backend level (``programs.FAST_COMPILE``): a shorter compile
    # for a little more run time a step (benchmarks/RESULTS.md, "First batch"); the same indices.
    fast_compile_plan_rows: ClassVar[int] = 1024

    @property
    def seq_len(self) -> int:
        return self.window.seq_len

    def plan(self, rows: Rows, state=None) -> tuple[Plan, None]:
        """The example each row reads: ``shuffle(position)`` (with its epoch if reshuffling)."""
        example = self.shuffle_spec.apply(self.shuffle, rows.position, rows.epoch)
        return Plan(rows=rows, source=jnp.zeros(example.shape, jnp.int32), example=example), None

    def plan_members(self, member: Int[Array, " n"], rows: Rows) -> Plan:
        """Rows of alike windows over several caches, each by its own shuffle (one call)."""
        shuffles = None if self.shuffle is None else gather_members(self.shuffle, member)
        example = self.shuffle_spec.apply_lanes(shuffles, rows.position, rows.epoch)
        return Plan(rows=rows, source=jnp.zeros(example.shape, jnp.int32), example=example)

    def build(self, plan: Plan, content: Content) -> Batch:
        """Rows of the batch from their windows in the fetched buffer."""
        return self.window(plan, content)

    def builder(self) -> WindowBuild:
        """Windows of any cache build alike: ``build`` reads only the content and these fields."""
        return self.window


class CausalLMDataset(Dataset):
    """Fixed windows of ``seq_len`` tokens from a token source, shuffled per ``ShuffleSpec``.

    Args:
        source: a ``TokenCache`` (or any ``TokenSource`` with ``num_tokens``).
        seq_len: tokens per example.
        shuffle: the ordering; ``ShuffleSpec(strategy="none")`` keeps cache order. A block
            shuffle without ``io_block_size`` aligns a block with one read chunk of the cache.
        eos_id: token that ends a document (segment ids break after it); ``None``: one segment.
        ignore_id: token never used as a target; ``None``: only the last position is masked.

    Raises:
        TypeError, ValueError: naming the argument, for a bad ``seq_len``, shuffle or token id,
            a source too small for one window or too large for 2^32 windows, or a shuffle that
            needs the final length over a source still being written.
    """

    source: TokenSource
    seq_len: int
    shuffle_spec: ShuffleSpec
    eos_id: int | None
    ignore_id: int | None
    num_examples: int
    max_row_tokens: int
    spans_per_row: int = 1

    def __init__(
        self,
        source,
        seq_len: int,
        *,
        shuffle: ShuffleSpec = FULL_SHUFFLE,
        eos_id: int | None = None,
        ignore_id: int | None = None,
    ):
        check_cache("source", source, ("num_tokens", "prepare_read"), "a TokenCache or another TokenSource")
        seq_len = check_int("seq_len", seq_len, low=1)
        if not isinstance(shuffle, ShuffleSpec):
            raise TypeError(f"shuffle must be a ShuffleSpec (got shuffle={shuffle!r})")
        self.sources = (source,)
        self.source = source
        self.seq_len = self.max_row_tokens = seq_len
        self.shuffle_spec = shuffle
        self.length_is_final = bool(getattr(source, "is_finished", True))
        if self.length_is_final:
            self.num_examples = _final_length(source, seq_len)
        elif shuffle.strategy not in GROWING_ORDERS:
            raise ValueError(
                f"shuffle strategy={shuffle.strategy!r} needs the final length of {source!r}, which "
                f"is still being written ({source.num_tokens} tokens committed): use "
                "ShuffleSpec('era', era_length=...) or ShuffleSpec('none') to train while it is "
                "written, or wait until it is finished"
            )
        else:
            self.num_examples = MAX_EXAMPLES  # a bound until the writer finishes
        self.eos_id = check_token_id("eos_id", eos_id, optional=True)
        self.ignore_id = check_token_id("ignore_id", ignore_id, optional=True)

    def wait_for(self, examples: int) -> CausalLMDataset | None:
        """Blocks until windows ``[0, examples)`` (whole eras of them) are committed, or the cache
        is finished: then returns the final dataset (a new value, ``num_examples`` the real
        length); ``None`` while the cache grows, and always once the length is final.

        Raises:
            CacheWaitTimeout: the writer committed too little for ``MESHBATCH_CACHE_WAIT_S``
                seconds (``meshbatch.cache.poll_until``: a stalled writer), naming the cache and
                the rows it had.
        """
        if self.length_is_final:
            return None
        era = self.shuffle_spec.era_length if self.shuffle_spec.strategy == "era" else 1
        needed = -(-examples // era) * era * self.seq_len

        def ready() -> tuple[CausalLMDataset | None] | None:
            self.source.refresh()
            if self.source.is_finished:
                final = CausalLMDataset(
                    self.source, self.seq_len, shuffle=self.shuffle_spec, eos_id=self.eos_id,
                    ignore_id=self.ignore_id,
                )  # fmt: skip
                logger.info("%r finished: %d examples per epoch", self.source, final.num_examples)
                return (final,)
            return (None,) if self.source.num_tokens >= needed else None

        def status() -> str:
            rows = getattr(self.source, "num_rows", "?")
            return (f"has {rows} rows ({self.source.num_tokens} tokens) committed, fewer than the "
                    f"{needed} tokens {examples} examples need")  # fmt: skip

        path = getattr(self.source, "path", None) or repr(self.source)
        return poll_until(ready, path=path, status=status, why="its writer commits them")[0]

    def make(self, key: PRNGKeyArray) -> tuple[CausalDevice, CausalLMDataset]:
        """The shuffle for ``key`` (``None`` for cache order) and the window build; the host half
        is the dataset itself."""
        chunk = max(1, DEFAULT_CHUNK_SIZE // self.seq_len)
        shuffle = self.shuffle_spec.create(self.num_examples, key, default_block=chunk)
        window = WindowBuild(self.seq_len, self.eos_id, self.ignore_id)
        return CausalDevice(self.shuffle_spec, shuffle, window), self

    def spans(self, plan: Plan) -> Spans:
        """Each row's window: tokens ``[example * seq_len, (example + 1) * seq_len)``."""
        starts = plan.example.astype(np.int64)[:, None] * self.seq_len
        return Spans(np.zeros(starts.shape, np.int32), starts, np.full(starts.shape, self.seq_len, np.int64))

    def spans_key(self) -> tuple:
        """Windows of any source are read alike: spans depend on ``seq_len`` and the plan only."""
        return ("causal windows", self.seq_len)

    def __repr__(self) -> str:
        return (
            f"CausalLMDataset(examples={self.num_examples}, seq_len={self.seq_len}, "
            f"shuffle={self.shuffle_spec}, eos_id={self.eos_id}, ignore_id={self.ignore_id})"
        )


def _final_length(source, seq_len: int) -> int:
    num_tokens = check_int("source.num_tokens", source.num_tokens, low=0)
    num_examples = num_tokens // seq_len
    if num_examples < 1:
        raise ValueError(f"the source holds {num_tokens} tokens: not one window of seq_len={seq_len}")
    if num_examples > MAX_EXAMPLES:
        raise ValueError(f"{num_examples} examples exceed 2**32 - 1; use a longer seq_len or split the cache")
    return num_examples
