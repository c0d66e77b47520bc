"""The preblocked-data smoke test: index building, random access, basic throughput.

Runs under pytest, or alone (no make)::

    python tests/datasets/test_preblock_smoke.py || echo "Smoke test failed"
    PREBLOCK_PATH=/data/blocks python tests/datasets/test_preblock_smoke.py   # your store or chunk*.npy dir

Without ``PREBLOCK_PATH`` it packs CPython's pydoc topics (one document per paragraph, byte
tokens) into a temporary store of 128-token blocks first. Throughput is printed, never asserted.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np


def build_default(root: str, topics_limit: int | None = None) -> str:
    from pydoc_data.topics import topics

    from meshbatch.datasets.preblocked import preblock

    text = os.path.join(root, "topics.jsonl")
    with open(text, "w") as f:
        for name in sorted(topics)[:topics_limit]:
            for para in topics[name].split("\n\n"):
                if para.strip():
                    f.write(json.dumps({"text": para}) + "\n")
    out = os.path.join(root, "store")
    preblock(out, [text], block_size=128, progress=False)
    return out


def smoke(path: str, *, reads: int = 2000, batch: int = 256, seed: int = 0) -> dict[str, float]:
    """Opens ``path`` (index building), reads random blocks and checks them against a sequential
    read (random access), and times batched random reads (throughput)."""
    from meshbatch.datasets.preblocked import open_blocks
    from meshbatch.datasets.preblocked.block_dataset import BlockDataset

    t0 = time.perf_counter()
    source = open_blocks(path)
    dataset = BlockDataset(path)  # header, ids, per-block real token counts
    index_s = time.perf_counter() - t0
    n, size = source.num_blocks, source.block_size
    assert n == dataset.num_examples and n > 0 and size == dataset.seq_len

    everything = source.read_blocks(np.arange(n))
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, reads)
    np.testing.assert_array_equal(source.read_blocks(rows), everything[rows])
    pad = dataset.ids["pad_id"]
    np.testing.assert_array_equal(source.real_tokens(), np.count_nonzero(everything != pad, axis=1))

    t0 = time.perf_counter()
    for lo in range(0, reads, batch):
        source.read_blocks(rows[lo : lo + batch])
    read_s = time.perf_counter() - t0
    return {
        "blocks": n,
        "block_size": size,
        "index_seconds": index_s,
        "random_blocks_per_second": reads / read_s,
        "random_tokens_per_second": reads * size / read_s,
    }


def test_smoke(tmp_path):
    path = os.environ.get("PREBLOCK_PATH") or build_default(str(tmp_path), topics_limit=20)
    stats = smoke(path)
    print(json.dumps(stats))
    assert stats["blocks"] > 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        target = os.environ.get("PREBLOCK_PATH") or build_default(tmp)
        try:
            result = smoke(target)
        except Exception as e:  # the script's contract: a message and a non-zero exit
            print(f"smoke test failed: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(1)
        print(json.dumps(result, indent=1))
