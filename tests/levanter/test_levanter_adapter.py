"""meshbatch.levanter: Levanter's DataLoader consumes our datasets; block shuffle keeps marin's order."""

import asyncio

import haliax as hax
import jax
import numpy as np
from levanter.data import ListAsyncDataset
from levanter.data.loader import DataLoader
from reference import marin_block_order

import meshbatch
from meshbatch.levanter import BlockShufflingDataset, MultiSpliceDocumentDataset, SpliceDocumentDataset

DOCS = [np.random.default_rng(i).integers(3, 500, n).astype(np.int32) for i, n in enumerate((300, 700, 120))]
SPEC = dict(content_length=24, content_start_mode="coverage_balanced", alpha=0.8, balance_mode="by_document")


def test_dataloader_yields_the_splice_batches():
    Pos = hax.Axis("position", 32)
    dataset = MultiSpliceDocumentDataset(
        Pos=Pos, doc_tokens_list=DOCS, pad_token_id=0, eos_token_id=1, **SPEC
    )
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    want = meshbatch.splice_batch(DOCS, np.arange(16), seq_len=32, pad_token_id=0, eos_token_id=1, **SPEC)
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        batch = next(iter(DataLoader(dataset, 16, mesh=mesh, axis_resources={"batch": "data"})))
    np.testing.assert_array_equal(np.asarray(batch.tokens.array), np.asarray(want.tokens))
    np.testing.assert_array_equal(np.asarray(batch.loss_mask.array), np.asarray(want.loss_mask))
    np.testing.assert_array_equal(
        np.asarray(batch.attn_mask.segment_ids[0].array), np.asarray(want.segment_ids)
    )


def test_single_document_example_a():
    """The seed's example A through the Levanter class: S=5, K=3, slide_within, 13 frames."""
    dataset = SpliceDocumentDataset(
        Pos=hax.Axis("position", 5), doc_tokens=np.arange(5), pad_token_id=9,
        content_length=3, content_start_mode="slide_within",
    )  # fmt: skip
    assert asyncio.run(dataset.async_len()) == 13
    frames = asyncio.run(dataset.get_batch(list(range(13))))
    assert [ex.tokens.array.tolist() for ex in frames[:4]] == [
        [0, 1, 2, 9, 9],
        [9, 0, 1, 2, 9],
        [9, 9, 0, 1, 2],
        [1, 2, 3, 9, 9],
    ]
    assert frames[-1].tokens.array.tolist() == [9, 9, 9, 3, 4]


def test_block_shuffling_dataset_keeps_marins_order():
    n, key = 1000, jax.random.PRNGKey(3)
    shuffled = BlockShufflingDataset(
        ListAsyncDataset(list(range(n)), is_complete=True), 16, window_blocks=4, key=key
    )
    got = asyncio.run(shuffled.get_batch(list(range(n))))
    assert got == marin_block_order(n, 16, 4, key, "feistel")
