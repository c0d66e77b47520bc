"""The kernel families ``meshbatch bench`` measures, each at shapes a user gives or realistic
defaults: a pure function, its arguments at step 0 with key 0, and the same at another step and
another key (which must compile nothing new).

Each case runs what the pipeline runs: a shuffle's plan of one step's rows, a causal build of a
fetched buffer, a splice dataset's device plan and frames, a stable mixture's row lookup, a
token-balanced mixture's plan from its state, the preblocked packing plan and block build, MLM
masking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meshbatch.arguments import check_int

U32 = np.uint32


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The shapes every case derives its inputs from (``meshbatch bench`` flags).

    Attributes:
        rows: rows of one step (a global batch).
        seq_len: tokens per row.
        examples: examples per epoch (the shuffles' length).
        sources: components of a mixture.
        docs: documents of a splice pool and of a packing plan.
        doc_tokens: mean tokens per document.
    """

    rows: int = 1024
    seq_len: int = 2048
    examples: int = 1 << 30
    sources: int = 16
    docs: int = 4096
    doc_tokens: int = 1024

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_int(field.name, getattr(self, field.name), low=1)
        check_int("examples", self.examples, low=self.rows, high=2**32 - 1)


TINY = Shapes(rows=16, seq_len=32, examples=4096, sources=3, docs=32, doc_tokens=48)


@dataclasses.dataclass(frozen=True)
class Case:
    """One measured function: ``fn(*args)`` at step 0 / key 0, and ``variants``."""

    name: str
    family: str
    fn: Callable
    args: tuple
    variants: tuple[tuple[str, tuple], ...]
    config: dict[str, Any]


def _case(name: str, fn: Callable, at: Callable[[int, int], tuple], config: dict[str, Any]) -> Case:
    """The case ``name`` of ``CASES``: ``fn`` on ``at(step, key)`` at step 0 / key 0, with the
    variants step 1 / key 0 and step 0 / key 1."""
    variants = (("step 1", at(1, 0)), ("key 1", at(0, 1)))
    return Case(name, CASES[name][0], fn, at(0, 0), variants, config)


def _rows(shapes: Shapes, step: int) -> jnp.ndarray:
    return jnp.asarray((np.arange(shapes.rows) + step * shapes.rows) % shapes.examples, U32)


def _shuffle_case(name: str, make, shapes: Shapes, config: dict) -> Case:
    def fn(shuffle, positions):
        return shuffle(positions)

    def at(step: int, key: int) -> tuple:
        return make(jax.random.key(key)), _rows(shapes, step)

    return _case(name, fn, at, config | {"rows": shapes.rows, "examples": shapes.examples})


def permutation_case(shapes: Shapes) -> Case:
    from meshbatch.shuffles import permutation

    return _shuffle_case(
        "permutation",
        lambda key: permutation("feistel", shapes.examples, key),
        shapes,
        {"kind": "feistel"},
    )


def era_shuffle_case(shapes: Shapes) -> Case:
    from meshbatch.shuffles import era_shuffle

    era = min(65536, shapes.examples)
    return _shuffle_case(
        "era_shuffle",
        lambda key: era_shuffle(shapes.examples, era_length=era, key=key),
        shapes,
        {"era_length": era},
    )


def block_shuffle_case(shapes: Shapes) -> Case:
    from meshbatch.shuffles import block_shuffle

    io, window = 256, 64
    return _shuffle_case(
        "block_shuffle",
        lambda key: block_shuffle(shapes.examples, io_block_size=io, window_blocks=window, key=key),
        shapes,
        {"io_block_size": io, "window_blocks": window},
    )


def causal_build_case(shapes: Shapes) -> Case:
    """``CausalDevice.build``'s work: windows cut from a fetched buffer, loss mask, segment ids."""
    from meshbatch.datasets.causal import WindowBuild
    from meshbatch.datasets.protocol import Content, Plan, Rows

    build = WindowBuild(shapes.seq_len, 0, None)
    n, s = shapes.rows, shapes.seq_len

    def inputs(step: int, key: int):
        rng = np.random.default_rng(step + 2 * key)  # seeds 0, 1, 2: step 0, step 1, key 1
        tokens = jnp.asarray(rng.integers(0, 50000, n * s, dtype=np.int32))
        offsets = jnp.asarray((rng.permutation(n) * s).astype(np.int32)[:, None])
        rows = Rows(jnp.zeros(n, U32), jnp.zeros(n, U32))
        plan = Plan(rows=rows, source=jnp.zeros(n, jnp.int32), example=jnp.zeros(n, U32))
        return plan, Content(tokens, offsets)

    def fn(plan, content):
        return build(plan, content)

    return _case("causal_build", fn, inputs, {"rows": n, "seq_len": s})


def _docs(shapes: Shapes, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(2, shapes.doc_tokens // 4), shapes.doc_tokens * 2, shapes.docs)
    return [rng.integers(3, 50000, int(k), dtype=np.int32) for k in lengths]


def splice_frames_case(shapes: Shapes) -> Case:
    """A pooled splice dataset's per-shard program: each row's placement, then its frame."""
    from meshbatch.datasets import Rows, SpliceLMDataset

    dataset = SpliceLMDataset(_docs(shapes), seq_len=shapes.seq_len, pad_token_id=0, eos_token_id=1)
    rows = min(shapes.rows, dataset.num_examples)

    def rows_at(step: int) -> Rows:
        positions = (np.arange(rows) + step * rows) % dataset.num_examples
        return Rows(jnp.asarray(positions, U32), jnp.zeros(rows, U32))

    def fn(device, rows):
        plan, _ = device.plan(rows, None)
        return device.build(plan, None)

    devices = [dataset.make(jax.random.key(key))[0] for key in (0, 1)]
    return _case(
        "splice_frames",
        fn,
        lambda step, key: (devices[key], rows_at(step)),
        {"rows": rows, "seq_len": shapes.seq_len, "docs": shapes.docs},
    )


def stable_mixture_case(shapes: Shapes) -> Case:
    """The stable mixture's lookup: each global row's (source, index, source epoch)."""
    from meshbatch.datasets.mixtures import mixture_schedule
    from meshbatch.kernels.internal import mixture_locate

    names = [f"s{i}" for i in range(shapes.sources)]
    lengths = {name: shapes.examples // shapes.sources + i for i, name in enumerate(names)}
    weights = {name: 1.0 + i for i, name in enumerate(names)}
    block = 2048

    def schedule(key):
        return mixture_schedule(lengths, weights, block_size=block, key=key)

    def fn(schedule, rows, epoch):
        return mixture_locate(schedule, rows, epoch)

    schedules, epoch = [schedule(jax.random.key(key)) for key in (0, 1)], jnp.asarray(0, U32)
    return _case(
        "stable_mixture_lookup",
        fn,
        lambda step, key: (schedules[key], _rows(shapes, step), epoch),
        {"rows": shapes.rows, "sources": shapes.sources, "block_size": block},
    )


def token_balanced_case(shapes: Shapes, cache) -> Case:
    """A token-balanced mixture's plan of one step from its state: the least-consumed selection
    and each chosen child's plan."""
    from meshbatch.datasets import CausalLMDataset
    from meshbatch.datasets.mixtures import TokenBalancedMixture
    from meshbatch.datasets.protocol import Rows
    from meshbatch.shuffles import ShuffleSpec

    seq = max(1, min(shapes.seq_len, cache.num_tokens // 2))
    children = {
        f"s{i}": CausalLMDataset(cache, seq, shuffle=ShuffleSpec("full")) for i in range(shapes.sources)
    }
    mixture = TokenBalancedMixture(children)
    state = mixture.init_state()
    rows = Rows(jnp.asarray(np.arange(shapes.rows), U32), jnp.zeros(shapes.rows, U32))

    def fn(device, rows, state):
        return device.plan(rows, state)

    devices = [mixture.make(jax.random.key(key))[0] for key in (0, 1)]
    _, after = jax.jit(lambda *a: fn(*a))(devices[0], rows, state)  # not fn's jit: its compile is measured
    return _case(
        "token_balanced_plan",
        fn,
        lambda step, key: (devices[key], rows, after if step else state),
        {"rows": shapes.rows, "sources": shapes.sources},
    )


def packing_case(shapes: Shapes) -> Case:
    """The preblocked packing plan (first-fit decreasing in buffers) of a stream of documents."""
    from meshbatch.kernels import pack_plan

    def lengths(step: int, key: int):
        rng = np.random.default_rng(step + 2 * key)
        return (jnp.asarray(rng.integers(1, shapes.doc_tokens * 2, shapes.docs, dtype=np.int32)),)

    def fn(lengths):
        return pack_plan(lengths, block_size=shapes.seq_len, rule="ffd", buffer_docs=min(1024, shapes.docs))

    return _case(
        "preblocked_packing",
        fn,
        lengths,
        {"docs": shapes.docs, "block_size": shapes.seq_len},
    )


def block_build_case(shapes: Shapes) -> Case:
    """Preblocked rows' build: loss mask and segment ids of ``[DOC] ... [EOD]`` blocks."""
    from meshbatch.kernels import block_batch

    def tokens(step: int, key: int):
        rng = np.random.default_rng(step + 2 * key)
        t = rng.integers(4, 50000, (shapes.rows, shapes.seq_len), dtype=np.int32)
        t[:, 0] = 1
        t[:, -1] = 2
        return (jnp.asarray(t),)

    def fn(tokens):
        return block_batch(tokens, doc_id=1, eod_id=2, pad_id=0)

    return _case(
        "preblocked_block_build",
        fn,
        tokens,
        {"rows": shapes.rows, "seq_len": shapes.seq_len},
    )


def mlm_case(shapes: Shapes) -> Case:
    """MLM masking of one step's rows, each row keyed by its stream position."""
    from meshbatch.kernels import mlm_mask
    from meshbatch.kernels.internal import row_keys

    def inputs(step: int, key: int):
        rng = np.random.default_rng(step)
        tokens = jnp.asarray(rng.integers(4, 50000, (shapes.rows, shapes.seq_len), dtype=np.int32))
        return tokens, row_keys(jax.random.key(key), _rows(shapes, step))

    def fn(tokens, keys):
        return mlm_mask(
            tokens, keys, rate=0.15, mask_id=3, vocab_size=50000, special_ids=(0, 1, 2), ignore_id=-100
        )

    return _case("mlm_masking", fn, inputs, {"rows": shapes.rows, "seq_len": shapes.seq_len, "rate": 0.15})


# name -> (family, maker); makers that read a token cache take it as a second argument
CASES: dict[str, tuple[str, Callable]] = {
    "permutation": ("permutations", permutation_case),
    "era_shuffle": ("era and block shuffles", era_shuffle_case),
    "block_shuffle": ("era and block shuffles", block_shuffle_case),
    "causal_build": ("causal build", causal_build_case),
    "splice_frames": ("splice frames", splice_frames_case),
    "stable_mixture_lookup": ("mixture selection", stable_mixture_case),
    "token_balanced_plan": ("mixture selection", token_balanced_case),
    "preblocked_packing": ("preblocked packing", packing_case),
    "preblocked_block_build": ("preblocked packing", block_build_case),
    "mlm_masking": ("MLM masking", mlm_case),
}
NEEDS_CACHE = ("token_balanced_plan",)
