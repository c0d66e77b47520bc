"""A small chat and supervised corpus, generated (no downloads), and its caches written by
Levanter's own ``SerialCacheWriter`` (the layout its chat and supervised processors write:
``input_ids`` + ``assistant_masks``, or ``input_ids`` + one ``sources_len`` value per row).

A chat example alternates user and assistant turns after a one-token system prefix (mask 0 on
user turns and the prefix, 1 on assistant turns); a supervised example is a prompt of
``sources_len`` tokens and a completion of at least one. Lengths run from 2 tokens to past the
row length the tests use, so every packing and slicing rule is met.
"""

from __future__ import annotations

import numpy as np


def chat_examples(
    seed: int, n: int, *, max_len: int = 40, vocab: int = 1000
) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(2, max_len + 1))
        mask = np.zeros(length, np.int32)
        at, assistant = 1, False
        while at < length:
            turn = int(rng.integers(1, 8))
            mask[at : at + turn] = int(assistant)
            at += turn
            assistant = not assistant
        if not mask.any():
            mask[-1] = 1
        ids = rng.integers(3, vocab, length).astype(np.int32)
        out.append((ids, mask))
    return out


def supervised_examples(
    seed: int, n: int, *, max_len: int = 40, vocab: int = 1000
) -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(2, max_len + 1))
        sources_len = int(rng.integers(1, length))
        out.append((rng.integers(3, vocab, length).astype(np.int32), sources_len))
    return out


def write_chat_cache(path, examples) -> str:
    from levanter.store.cache import SerialCacheWriter

    exemplar = {"input_ids": np.zeros((0,), np.int32), "assistant_masks": np.zeros((0,), np.int32)}
    with SerialCacheWriter(str(path), exemplar) as writer:
        for i in range(0, len(examples), 64):
            writer.write_batch([{"input_ids": ids, "assistant_masks": m} for ids, m in examples[i : i + 64]])
    return str(path)


def write_supervised_cache(path, examples) -> str:
    from levanter.store.cache import SerialCacheWriter

    exemplar = {"input_ids": np.zeros((0,), np.int32), "sources_len": np.zeros((0,), np.int32)}
    with SerialCacheWriter(str(path), exemplar) as writer:
        store = writer._tree_store
        for i in range(0, len(examples), 64):
            # What Levanter's Ray writer does per batch (its SerialCacheWriter.write_batch assumes
            # rank-1 fields and fails on the per-row sources_len scalar; see meshbatch.levanter.caches)
            rows = [{"input_ids": ids, "sources_len": np.int32(s)} for ids, s in examples[i : i + 64]]
            store.extend_with_batch(store.batch_preparer(rows))
    return str(path)
