"""Preblocked stores at ``gs://`` and ``s3://`` URLs: real servers on 127.0.0.1 (fake-gcs-server, moto).

``meshbatch preblock`` writes a store at a URL through TensorStore's kvstores (arrays, header,
checksum sidecar, ledger, the incomplete marker, the tokens cache); ``BlockDataset`` reads it back
in a ``Pipeline`` with the batches of the same store written to a local directory, and
``validate-blocks`` reports the same. Overwrites, an interrupted write's leftovers, a token cache
at a URL as the input, and ``npy`` at a URL (refused) are checked on the way.
"""

import json
import uuid

import jax
import numpy as np
import pytest
import tensorstore as ts
from jax.sharding import Mesh

from meshbatch import Pipeline, ShuffleSpec
from meshbatch.cache.format.stores import kvstore_spec
from meshbatch.cli import main
from meshbatch.datasets.preblocked import BlockDataset, preblock, validate_path

BLOCK, BATCH, STEPS, KEY = 32, 8, 3, 5
LEAVES = ("tokens", "loss_mask", "segment_ids")
WORDS = "the of and to in a is that for it as was with be by on not he this are or his".split()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Documents of 1-40 words (some longer than a block) as JSONL, and their store written locally."""
    root = tmp_path_factory.mktemp("preblock-urls")
    rng = np.random.default_rng(0)
    text = root / "docs.jsonl"
    with open(text, "w") as f:
        for _ in range(60):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS, int(rng.integers(1, 40))))}) + "\n")
    store = str(root / "store")
    preblock(store, [str(text)], block_size=BLOCK, key=KEY, progress=False)
    return {"text": str(text), "store": store, "root": root}


def url(scheme: str) -> str:
    return f"{scheme}://meshbatch/{uuid.uuid4().hex}/blocks"


def keys(path: str) -> list[str]:
    """Every object under a URL (relative names), listed through TensorStore."""
    store = ts.KvStore.open(kvstore_spec(path)).result()
    return sorted(k.decode() for k in store.list().result())


def batches(path: str) -> list[dict[str, np.ndarray]]:
    """``STEPS`` batches of a fully shuffled ``BlockDataset`` through a prefetching pipeline."""
    dataset = BlockDataset(path, shuffle=ShuffleSpec("full"))
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=7, prefetch=2, workers=1)
    with pipeline.iterate_from(0) as stream:
        out = [{leaf: np.asarray(getattr(next(stream), leaf)) for leaf in LEAVES} for _ in range(STEPS)]
    stats = pipeline.stats()
    assert stats["requests_per_example"] > 0 and stats["bytes_per_example"] >= BLOCK * 4, stats
    return out


@pytest.fixture(scope="module")
def want(local):
    return batches(local["store"])


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_store_written_at_a_url_reads_back_as_the_local_one(object_stores, local, want, scheme, capsys):
    remote = url(scheme)
    args = [
        "preblock",
        remote,
        local["text"],
        "--block-size",
        str(BLOCK),
        "--seed",
        str(KEY),
        "--no-progress",
    ]
    assert main(args) == 0
    assert f"wrote {remote}" in capsys.readouterr().out
    names = keys(remote)
    for name in ("preblock.json", "shard_ledger.json", "meshbatch_block_checksums.json", "blocks/zarr.json",
                 "real_tokens/zarr.json", "tokens/shard_ledger.json"):  # fmt: skip
        assert name in names, names  # every file of the store is an object in the bucket
    assert ".preblock-incomplete" not in names  # removed once the write completed
    got, expected = BlockDataset(remote), BlockDataset(local["store"])
    (source,), (reference,) = got.sources, expected.sources
    assert (source.num_blocks, source.block_size) == (reference.num_blocks, BLOCK)
    assert source.header.counts == reference.header.counts and got.ids == expected.ids
    every = np.arange(reference.num_blocks)
    np.testing.assert_array_equal(source.read_blocks(every), reference.read_blocks(every))
    np.testing.assert_array_equal(source.real_tokens(), reference.real_tokens())
    assert (
        source.verifier is not None and source.verifier.data == reference.verifier.data
    )  # sidecar read back

    for step, (a, b) in enumerate(zip(batches(remote), want, strict=True)):
        for leaf in LEAVES:
            np.testing.assert_array_equal(a[leaf], b[leaf], err_msg=f"step {step} {leaf}")

    report, local_report = (
        validate_path(p, carry_open_doc=True, progress=False) for p in (remote, local["store"])
    )
    assert report.ok and report.counts == local_report.counts and report.blocks == reference.num_blocks
    plain = validate_path(remote, progress=False)  # without carrying: each split document is flagged
    assert plain.counts["unclosed_doc"] == source.header.counts["split_documents"] > 0
    assert main(["validate-blocks", remote, "--carry-open-doc", "--no-progress"]) == 0


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_overwrite_leftovers_and_inputs_at_a_url(object_stores, local, scheme, tmp_path):
    remote = url(scheme)
    preblock(remote, [local["text"]], block_size=BLOCK, key=KEY, progress=False)
    with pytest.raises(FileExistsError, match="exists; pass if_exists='overwrite'"):
        preblock(remote, [local["text"]], block_size=BLOCK, progress=False)
    preblock(remote, [local["text"]], block_size=16, key=KEY, if_exists="overwrite", progress=False)
    (source,) = BlockDataset(remote).sources
    assert source.block_size == 16 and validate_path(remote, carry_open_doc=True, progress=False).ok

    # a prefix holding other objects and no header is never overwritten
    other = url(scheme)
    ts.KvStore.open(kvstore_spec(other)).result().write("notes.txt", b"keep me").result()
    with pytest.raises(FileExistsError, match=r"holds no preblock\.json"):
        preblock(other, [local["text"]], block_size=BLOCK, if_exists="overwrite", progress=False)
    assert keys(other) == ["notes.txt"]

    # an interrupted write's leftovers (the marker and a partial array) are rebuilt, whatever if_exists
    killed = url(scheme)
    ts.KvStore.open(kvstore_spec(killed)).result().write(".preblock-incomplete", b"{}").result()
    ts.KvStore.open(kvstore_spec(killed)).result().write("blocks/c/99/0", b"partial").result()
    preblock(killed, [local["text"]], block_size=BLOCK, key=KEY, progress=False)
    names = keys(killed)
    assert "blocks/c/99/0" not in names and ".preblock-incomplete" not in names and "blocks/c/0/0" in names
    np.testing.assert_array_equal(
        BlockDataset(killed).sources[0].read_blocks([0, 1]),
        BlockDataset(local["store"]).sources[0].read_blocks([0, 1]),
    )

    # the token cache a URL store kept is an input like a local one: the same blocks
    from_cache = str(tmp_path / "from-cache")
    preblock(from_cache, [f"{killed}/tokens"], block_size=BLOCK, key=KEY, progress=False)
    a, b = BlockDataset(from_cache).sources[0], BlockDataset(local["store"]).sources[0]
    np.testing.assert_array_equal(
        a.read_blocks(np.arange(b.num_blocks)), b.read_blocks(np.arange(b.num_blocks))
    )

    with pytest.raises(ValueError, match=r"output_format=.npy. writes local \.npy files"):
        preblock(url(scheme), [local["text"]], block_size=BLOCK, output_format="npy", progress=False)
