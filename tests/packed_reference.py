"""An independent, deliberately plain numpy/Python reference of packed rows (``PackedDataset``).

Packing rules (lists and loops, one example at a time):

* ``greedy`` (Levanter's ``pack_documents``): a row takes examples in order while their tokens
  stay within ``seq_len`` and it holds fewer than ``max_segments``; an example longer than
  ``seq_len`` sits alone.
* ``first_fit``: windows of ``window`` examples; each example (largest first with ``decreasing``)
  into the first row of its window with room (tokens and a segment slot), else a new row.

Rows: tokens back to back, ``pad_id`` after; segment id = the example's cache row (-1 on padding);
positions restart per example; loss masks by the rules of ``kernels/packed/packed_rows.py``,
written out position by position.
"""

from __future__ import annotations

import numpy as np


def greedy_packs(lengths, seq_len: int, max_segments: int) -> list[list[int]]:
    packs: list[list[int]] = []
    used = 0
    for i, length in enumerate(lengths):
        if packs and len(packs[-1]) < max_segments and used + length <= seq_len:
            packs[-1].append(i)
            used += length
        else:
            packs.append([i])
            used = length
    return packs


def first_fit_packs(order, lengths, seq_len: int, max_segments: int, window: int, decreasing: bool):
    packs: list[list[int]] = []
    for lo in range(0, len(order), window):
        chunk = list(order[lo : lo + window])
        if decreasing:
            chunk = sorted(chunk, key=lambda e: -min(lengths[e], seq_len))  # stable: ties in order
        bins: list[list[int]] = []
        free: list[int] = []
        for e in chunk:
            size = min(lengths[e], seq_len)
            for b in range(len(bins)):
                if free[b] >= size and len(bins[b]) < max_segments:
                    bins[b].append(e)
                    free[b] -= size
                    break
            else:
                bins.append([e])
                free.append(seq_len - size)
        packs.extend(bins)
    return packs


def build_row(members, examples, *, fmt: str, seq_len: int, rule: str, mask_prompt: bool,
              slice_strategy: str, pad_id: int = 0) -> dict[str, np.ndarray]:  # fmt: skip
    """One packed row. ``examples[i]`` is ``(ids, assistant_mask)`` (chat) or ``(ids, sources_len)``."""
    tokens, masks, segs, pos, loss, ends = [], [], [], [], [], []
    for e in members:
        ids, extra = examples[e]
        n = len(ids)
        cut = n - seq_len if (n > seq_len and slice_strategy == "right") else 0
        keep = min(n, seq_len)
        kept_ids = list(ids[cut : cut + keep])
        am = list(extra[cut : cut + keep]) if fmt == "chat" else [0] * keep
        for p in range(keep):
            tokens.append(int(kept_ids[p]))
            masks.append(int(am[p]))
            segs.append(e)
            pos.append(p)
            if rule == "levanter":
                if fmt == "supervised" and mask_prompt:
                    loss.append(int(p >= extra))
                else:
                    loss.append(None)  # chat: filled from the row below
            else:
                last = p == keep - 1
                if last:
                    loss.append(0)
                elif not mask_prompt:
                    loss.append(1)
                elif fmt == "chat":
                    loss.append(int(am[p + 1] != 0))
                else:
                    loss.append(int(cut + p + 1 >= extra))
        ends.append(len(tokens))
    real = len(tokens)
    assert real <= seq_len
    pad = seq_len - real
    tokens += [pad_id] * pad
    masks += [0] * pad
    segs += [-1] * pad
    pos += [0] * pad
    if rule == "levanter":
        if not mask_prompt:
            loss = [1] * seq_len
        elif fmt == "chat":
            loss = [masks[t + 1] if t + 1 < seq_len else 0 for t in range(seq_len)]
        else:
            loss = loss + [0] * pad
        loss[-1] = 0
    else:
        loss = loss + [0] * pad
    cu = [0, *ends]
    return {
        "tokens": np.array(tokens, np.int32),
        "loss_mask": np.array(loss, np.int32),
        "segment_ids": np.array(segs, np.int32),
        "positions": np.array(pos, np.int32),
        "cu_seqlens": np.array(cu, np.int32),
    }


def packs_for(examples, *, seq_len: int, pack: bool, compat, max_segments: int, window: int,
              decreasing: bool, example_order) -> list[list[int]]:  # fmt: skip
    lengths = [len(ex[0]) for ex in examples]
    segments = min(max_segments, seq_len)
    if not pack:
        return [[i] for i in range(len(examples))]
    if compat == "levanter":
        return greedy_packs(lengths, seq_len, segments)
    return first_fit_packs(example_order, lengths, seq_len, segments, window, decreasing)


def reference_batch(examples, packs, pack_ids, *, fmt, seq_len, rule, mask_prompt, slice_strategy,
                    segments) -> dict[str, np.ndarray]:  # fmt: skip
    rows = [
        build_row(
            packs[int(i)],
            examples,
            fmt=fmt,
            seq_len=seq_len,
            rule=rule,
            mask_prompt=mask_prompt,
            slice_strategy=slice_strategy,
        )
        for i in pack_ids
    ]
    out = {k: np.stack([r[k] for r in rows]) for k in ("tokens", "loss_mask", "segment_ids", "positions")}
    cu = np.zeros((len(rows), segments + 1), np.int32)
    for j, r in enumerate(rows):
        ends = r["cu_seqlens"]
        cu[j, : ends.size] = ends
        cu[j, ends.size :] = ends[-1]
    out["cu_seqlens"] = cu
    return out
