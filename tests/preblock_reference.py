"""Plain-Python references for the preblock kernels: packing, block assembly, validation, masking.

Each is written the obvious way (loops over documents and tokens) so that the jitted kernels can be
compared against something that is easy to read; ``benchmarks/bench_preblock.py`` times them too.
"""

from __future__ import annotations

import numpy as np

MARKERS = 2


def pack_greedy(lengths, block_size: int) -> tuple[list[tuple[int, int]], int]:
    """Plain next-fit: ``([(block, offset) per doc], num_blocks)``."""
    S = block_size
    block, used, out = -1, S, []
    for length in lengths:
        size = int(length) + MARKERS
        if (used == S) if size > S else (used + size > S):
            block, used = block + 1, 0
        out.append((block, used))
        end = used + size
        block, used = block + (end - 1) // S, (end - 1) % S + 1
    return out, block + 1


def pack_ffd(lengths, block_size: int, buffer_docs: int) -> tuple[list[tuple[int, int]], int]:
    """First-fit decreasing within buffers of ``buffer_docs`` documents (kernels/preblocked/packing.py)."""
    S = block_size
    out: list[tuple[int, int] | None] = [None] * len(lengths)
    first_block = 0
    for lo in range(0, len(lengths), buffer_docs):
        idx = list(range(lo, min(lo + buffer_docs, len(lengths))))
        # long documents first in stream order, then largest first; ties keep stream order
        idx.sort(key=lambda i: -min(int(lengths[i]) + MARKERS, S + 1))
        bins: list[list] = []  # [free, full blocks before it]
        placed = []  # (doc, bin, offset, back)
        for i in idx:
            size = int(lengths[i]) + MARKERS
            if size > S:
                last_free = bins[-1][0] if bins else 0
                rest = size - last_free
                full = -(-rest // S) - 1
                tail = rest - full * S
                if last_free > 0:
                    placed.append((i, len(bins) - 1, S - last_free, 0))
                    bins[-1][0] = 0
                else:
                    placed.append((i, len(bins), 0, full))
                bins.append([S - tail, full])
                continue
            for j, b in enumerate(bins):
                if b[0] >= size:
                    placed.append((i, j, S - b[0], 0))
                    b[0] -= size
                    break
            else:
                placed.append((i, len(bins), 0, 0))
                bins.append([S - size, 0])
        starts, at = [], first_block
        for _, full in bins:
            at += full
            starts.append(at)
            at += 1
        for i, j, offset, back in placed:
            out[i] = (starts[j] - back, offset)
        first_block = at
    return out, first_block


def assemble(docs, placement, num_blocks: int, block_size: int, *, doc_id, eod_id, pad_id) -> np.ndarray:
    """``[num_blocks, block_size]`` blocks from documents and their (block, offset) placement."""
    flat = np.full(num_blocks * block_size, pad_id, np.int64)
    for doc, (block, offset) in zip(docs, placement, strict=True):
        at = block * block_size + offset
        flat[at : at + len(doc) + 2] = [doc_id, *doc, eod_id]
    return flat.reshape(num_blocks, block_size)


def validate(
    blocks,
    *,
    doc_id,
    eod_id,
    pad_id,
    vocab_size,
    carry_open_doc=False,
    literal_heuristics=False,
    literal_window=8,
) -> list[tuple[int, int, str]]:
    """The structure check token by token: ``[(block, position, kind)]`` sorted (see
    ``meshbatch.kernels.preblocked.structure`` for the rules this restates)."""
    found = []
    carried = False
    structural = {doc_id, eod_id, pad_id}
    n = len(blocks)
    for b, block in enumerate(blocks):
        block = [int(t) for t in block]
        S = len(block)
        is_open = carried if carry_open_doc else False
        opened_at, implicit = (-1, False)
        for i, tok in enumerate(block):
            code = None
            if tok not in structural and not 0 <= tok < vocab_size:
                code = "out_of_vocab"
            elif i > 0 and block[i - 1] == pad_id and tok != pad_id:
                code = "marker_after_pad" if tok in (doc_id, eod_id) else "pad_in_middle"
            kind = None
            if tok == doc_id:
                left = i == 0 or block[i - 1] in structural
                right = i == S - 1 or block[i + 1] in structural
                if is_open and literal_heuristics and left and right:
                    kind = "literal_doc"
                else:
                    if is_open:
                        kind = "nested_doc"
                    is_open, opened_at, implicit = True, i, False
            elif tok == eod_id:
                if is_open:
                    is_open = False
                elif literal_heuristics and doc_id not in block[i + 1 : i + 1 + literal_window]:
                    kind = "literal_eod"
                else:
                    kind = "stray_eod"
            elif tok != pad_id and not is_open:
                kind = "content_outside_doc"
                is_open, opened_at, implicit = True, i, True
            code = code or kind
            if code:
                found.append((b, i, code))
        carried = is_open and not implicit
        if is_open and not implicit and (not carry_open_doc or b == n - 1):
            found.append((b, max(opened_at, 0), "unclosed_doc"))
    return sorted(found)
