"""``chunk*.pt`` files (``preblocked-chunks.md``'s artifacts) through ``torch.load(weights_only=True)``.

* preblocked form (a ``[N, block_size]`` LongTensor per file): ``BlockDataset`` over the ``.pt``
  directory gives the same batches through ``Pipeline`` as over the same blocks written as
  ``chunk*.npy`` by ``meshbatch preblock --format npy``;
* legacy form (lists of 1-D tensors, variable-length sequences): ``meshbatch convert-pt`` writes a
  token cache whose packed batches (``BlockDataset``'s legacy mode) equal those of a cache written
  straight from the same sequences;
* a pickle that is not plain tensors (a class instance, a dict, a float tensor, a list holding a
  non-tensor), the legacy form where a matrix is expected and a directory mixing ``.npy`` and
  ``.pt`` are refused by name.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest
import torch

from meshbatch import BlockDataset, CacheBlockDataset, PackSpec, Pipeline, ShuffleSpec
from meshbatch.cache import CacheWriter
from meshbatch.cli import main
from meshbatch.datasets.preblocked import preblock
from meshbatch.datasets.preblocked.block_sources import NotPlainTensors, load_pt

BLOCK = 32
IDS = dict(doc_id=257, eod_id=258, pad_id=259, vocab_size=257)


class Payload:
    """A pickled class instance: what ``weights_only=True`` must refuse to load."""


@pytest.fixture(scope="module")
def npy_and_pt(tmp_path_factory):
    root = tmp_path_factory.mktemp("pt")
    text = root / "docs.jsonl"
    rng = np.random.default_rng(0)
    with open(text, "w") as f:
        for _ in range(120):
            f.write(
                json.dumps({"text": "".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(3, 70)))})
                + "\n"
            )
    npy = str(root / "npy")
    preblock(npy, [str(text)], block_size=BLOCK, output_format="npy", progress=False)
    pt = root / "pt"
    pt.mkdir()
    for name in os.listdir(npy):
        if name.startswith("chunk") and name.endswith(".npy"):
            matrix = torch.from_numpy(np.load(os.path.join(npy, name)).astype(np.int64))  # a LongTensor
            torch.save(matrix, pt / name.replace(".npy", ".pt"))
        elif os.path.isfile(os.path.join(npy, name)) and not name.startswith("."):
            shutil.copy(os.path.join(npy, name), pt / name)  # preblock.json, real_tokens.npy
    return npy, str(pt)


def batches(dataset, steps: int = 4) -> list[dict]:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=8, key=5)
    return [
        {k: np.asarray(v) for k, v in vars(pipeline.batch(s)).items() if v is not None} for s in range(steps)
    ]


def test_pt_matrices_give_the_npy_batches(npy_and_pt):
    npy, pt = npy_and_pt
    assert any(f.endswith(".pt") for f in os.listdir(pt)) and not any(
        f.endswith(".npy") and f.startswith("chunk") for f in os.listdir(pt)
    )
    a, b = BlockDataset(npy, shuffle=ShuffleSpec("full")), BlockDataset(pt, shuffle=ShuffleSpec("full"))
    assert a.num_examples == b.num_examples > 8
    for step, (x, y) in enumerate(zip(batches(a), batches(b), strict=True)):
        assert x.keys() == y.keys()
        for name in x:
            np.testing.assert_array_equal(x[name], y[name], err_msg=f"{step=} {name}")


def test_legacy_sequences_convert_to_the_same_cache(tmp_path):
    rng = np.random.default_rng(1)
    sequences = [rng.integers(0, 257, rng.integers(1, 90)) for _ in range(70)]
    src = tmp_path / "legacy"
    src.mkdir()
    for i, lo in enumerate(range(0, 70, 25)):  # chunk0, chunk1, chunk2: natural order
        torch.save(
            [torch.from_numpy(s.astype(np.int64)) for s in sequences[lo : lo + 25]], src / f"chunk{i}.pt"
        )
    assert main(["convert-pt", str(src), str(tmp_path / "converted")]) == 0
    with CacheWriter(str(tmp_path / "direct")) as writer:
        writer.write([s.astype(np.int32) for s in sequences])
    got = CacheBlockDataset(str(tmp_path / "converted"), pack=PackSpec(BLOCK), **IDS)
    want = CacheBlockDataset(str(tmp_path / "direct"), pack=PackSpec(BLOCK), **IDS)
    for step, (x, y) in enumerate(zip(batches(got), batches(want), strict=True)):
        for name in y:
            np.testing.assert_array_equal(x[name], y[name], err_msg=f"{step=} {name}")
    with pytest.raises(
        NotPlainTensors, match=r"chunk0.pt holds a list of 25 sequences \(the legacy form\).*convert-pt"
    ):
        BlockDataset(str(src))


def test_anything_but_plain_tensors_is_refused(tmp_path, npy_and_pt):
    bad = {
        "instance": [Payload()],
        "dict": {"blocks": torch.zeros((2, 4), dtype=torch.int64)},
        "float": torch.zeros((2, 4)),
        "flat": torch.zeros(8, dtype=torch.int64),
        "mixed_list": [torch.zeros(3, dtype=torch.int64), 7],
    }
    messages = {
        "instance": r"torch.load\(weights_only=True\) refused it, so it is not plain tensors",
        "dict": r"holds a dict; a chunk is an integer \[rows, block_size\] tensor",
        "float": r"holds a torch.float32 tensor of shape \(2, 4\)",
        "flat": r"holds a torch.int64 tensor of shape \(8,\)",
        "mixed_list": r"item 1 of its list is <class 'int'>, not a 1-D integer tensor",
    }
    for name, obj in bad.items():
        d = tmp_path / name
        d.mkdir()
        torch.save(obj, d / "chunk0.pt")
        with pytest.raises(NotPlainTensors, match=messages[name]) as caught:
            load_pt(str(d / "chunk0.pt"))
        assert str(d / "chunk0.pt") in str(caught.value)
        with pytest.raises(NotPlainTensors, match=messages[name]):
            BlockDataset(str(d), **IDS)
    mixed = tmp_path / "mixed"
    shutil.copytree(npy_and_pt[0], mixed)
    torch.save(torch.zeros((2, BLOCK), dtype=torch.int64), mixed / "chunk99.pt")
    with pytest.raises(ValueError, match=r"mixes chunk\*.npy and chunk\*.pt files"):
        BlockDataset(str(mixed))
