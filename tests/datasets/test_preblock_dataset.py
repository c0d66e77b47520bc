"""BlockDataset: format detection (store, chunk*.npy, jagged cache, mixes refused) and identical
batches from every mode, through the dataset protocol (plan -> spans -> coalesced fetch -> build)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpora import preblocked_per_level, topic_texts, write_jsonl

from meshbatch import ShuffleSpec
from meshbatch.cache import run_reads
from meshbatch.datasets.preblocked import PackSpec, preblock
from meshbatch.datasets.preblocked.block_dataset import BlockDataset, CacheBlockDataset
from meshbatch.datasets.protocol import Content, Rows
from meshbatch.kernels import block_batch
from meshbatch.pipeline.programs import build_program_single, plan_program

BLOCK = 64
IDS = dict(doc_id=257, eod_id=258, pad_id=259, vocab_size=257)
KEY = 11  # the pipeline key of every step here; the stores are written with its packing key
PACK = BlockDataset.pack_key(KEY)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    text = write_jsonl(root / "docs.jsonl", topic_texts(30, paragraphs=12))
    paths = preblocked_per_level(root, text, block_size=BLOCK, key=PACK)
    paths["cache"] = os.path.join(paths["document"], "tokens")
    paths["npy"] = str(root / "npy")
    preblock(paths["npy"], [paths["cache"]], block_size=BLOCK, key=PACK, output_format="npy", progress=False)
    return paths


def fetch_and_build(dataset: BlockDataset, positions, epoch: int = 0):
    """One step the way the pipeline runs it: plan, spans, one coalesced read per source, build."""
    device, dataset = dataset.make(jax.random.key(KEY))  # legacy: packed for the key
    # (module-level programs: equal device halves compile once)
    n = len(positions)
    rows = Rows(position=jnp.asarray(positions, jnp.uint32), epoch=jnp.full((n,), epoch, jnp.uint32))
    plan, _ = plan_program(device, rows, None)
    spans = dataset.spans(jax.tree.map(np.asarray, plan))
    buffer = np.zeros(n * dataset.max_row_tokens + 1, np.int32)
    offsets, at, reads = np.zeros(spans.start.shape, np.int64), 0, []
    for s, source in enumerate(dataset.sources):
        mine = spans.source == s
        read = source.prepare_read(spans.start[mine], spans.length[mine], buffer, at)
        offsets[mine], at = read.span_starts, read.end
        reads.append(read)
    run_reads(reads)
    content = Content(tokens=jnp.asarray(buffer), offsets=jnp.asarray(offsets.astype(np.int32)))
    return build_program_single(device, plan, content), np.asarray(device.real_tokens(plan))


def test_format_detection_picks_the_mode(data):
    store, npy = BlockDataset(data["document"]), BlockDataset(data["npy"])
    legacy = CacheBlockDataset(data["cache"], pack=PackSpec(BLOCK), **IDS)
    with pytest.raises(AttributeError, match=r"depend on the packing key.*make\(key\)\[1\]\.num_examples"):
        legacy.num_examples  # noqa: B018 - unknown until packed for a key
    assert "unpacked" in repr(legacy)  # a repr never raises
    legacy = legacy.make(jax.random.key(KEY))[1]
    assert (store.format, npy.format, legacy.format) == ("store", "npy", "levanter")
    assert isinstance(legacy, CacheBlockDataset) and legacy.packed is not None
    assert store.spans_per_row == 1 and legacy.spans_per_row > 1
    assert store.num_examples == npy.num_examples == legacy.num_examples
    assert store.ids == IDS  # read from the header
    with pytest.raises(ValueError, match="mixed formats"):
        BlockDataset([data["document"], data["cache"]])
    with pytest.raises(ValueError, match="mixed formats"):
        BlockDataset([data["npy"], data["document"]])
    with pytest.raises(ValueError, match="mixed formats"):
        CacheBlockDataset([data["cache"], data["document"]], pack=PackSpec(BLOCK), **IDS)
    with pytest.raises(ValueError, match=r"jagged token cache: CacheBlockDataset\(paths, pack="):
        BlockDataset(data["cache"], **IDS)
    with pytest.raises(TypeError, match=r"takes no pack .*CacheBlockDataset\(paths, pack="):
        BlockDataset(data["cache"], pack=PackSpec(BLOCK), **IDS)  # the old spelling names the new class
    with pytest.raises(ValueError, match="CacheBlockDataset needs"):
        CacheBlockDataset(data["cache"], pack=PackSpec(BLOCK), doc_id=None, eod_id=None, pad_id=None,
                          vocab_size=None)  # fmt: skip
    with pytest.raises(TypeError, match="takes no pack"):
        BlockDataset(data["document"], pack=PackSpec(BLOCK))
    with pytest.raises(ValueError, match=r"packed already: read it with BlockDataset"):
        CacheBlockDataset(data["document"], pack=PackSpec(BLOCK), **IDS)
    two = BlockDataset([data["document"], data["segment"]])  # same format: concatenated
    assert two.num_examples == store.num_examples + BlockDataset(data["segment"]).num_examples


@pytest.mark.parametrize("level", ["document", "segment"])
def test_every_mode_gives_identical_batches(data, level):
    shuffle = ShuffleSpec(
        "none"
    )  # shuffles are ShuffleSpec's (tested with it); rows come in random order here
    modes = {
        "store": BlockDataset(data[level], shuffle=shuffle),
        "legacy": CacheBlockDataset(data["cache"], shuffle=shuffle, pack=PackSpec(BLOCK, level), **IDS),
    }
    if level == "document":
        modes["npy"] = BlockDataset(data["npy"], shuffle=shuffle)
    n = modes["store"].num_examples
    order = np.random.default_rng(0).permutation(n)
    for first in range(0, n, 256):
        positions = order[np.arange(first, first + 256) % n]
        built = {name: fetch_and_build(ds, positions) for name, ds in modes.items()}
        want, want_real = built.pop("store")
        for name, (batch, real) in built.items():
            for leaf in ("tokens", "loss_mask", "segment_ids"):
                np.testing.assert_array_equal(getattr(batch, leaf), getattr(want, leaf), err_msg=name)
            np.testing.assert_array_equal(real, want_real)
        np.testing.assert_array_equal(want_real, np.count_nonzero(np.asarray(want.tokens) != 259, axis=1))


def test_two_sources_read_in_one_step(data):
    one = BlockDataset(data["document"], shuffle=ShuffleSpec("none"))
    two = BlockDataset([data["document"], data["segment"]], shuffle=ShuffleSpec("none"))
    n = one.num_examples
    positions = np.arange(n - 40, n + 40)  # straddles the two sources
    batch, _ = fetch_and_build(two, positions)
    want = np.concatenate(
        [
            one.sources[0].read_blocks(np.arange(n - 40, n)),
            two.sources[1].read_blocks(np.arange(40)),
        ]
    )
    np.testing.assert_array_equal(np.asarray(batch.tokens), want)


def test_legacy_mode_over_two_caches_equals_two_stores(data):
    shuffle = ShuffleSpec("none")
    stores = BlockDataset([data["document"], data["document"]], shuffle=shuffle)
    legacy = CacheBlockDataset([data["cache"], data["cache"]], shuffle=shuffle, pack=PackSpec(BLOCK), **IDS)
    n = stores.num_examples
    assert legacy.make(jax.random.key(KEY))[1].num_examples == n
    positions = np.random.default_rng(1).integers(0, n, 256)
    (want, _), (got, _) = fetch_and_build(stores, positions), fetch_and_build(legacy, positions)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))


def test_build_kernel_golden_and_properties(data):
    # kernels/preblocked/structure.py's docstring trace: c E D a b E P P
    D, E, P = 257, 258, 259
    golden = block_batch(jnp.array([[5, E, D, 1, 2, E, P, P]], jnp.int32), doc_id=D, eod_id=E, pad_id=P)
    assert np.asarray(golden.segment_ids).tolist() == [[0, 0, 1, 1, 1, 1, -1, -1]]
    assert np.asarray(golden.loss_mask).tolist() == [[1, 0, 1, 1, 1, 0, 0, 0]]
    batch, _ = fetch_and_build(BlockDataset(data["segment"], shuffle=ShuffleSpec("none")), np.arange(256))
    tokens, loss, segment = (np.asarray(x) for x in (batch.tokens, batch.loss_mask, batch.segment_ids))
    assert np.all((segment == -1) == (tokens == P))  # padding is its own segment
    assert not np.any(loss[tokens == P]) and not np.any(loss[tokens == E])
    assert not np.any(loss[:, :-1] & (segment[:, :-1] != segment[:, 1:]))  # never across documents
    assert not np.any(loss[:, -1])
    starts_segment = np.diff(segment, axis=1) > 0
    assert np.all(tokens[:, 1:][starts_segment] == D)  # a new segment begins at each [DOC]
