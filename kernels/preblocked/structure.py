"""The ``[DOC]``/``[EOD]`` structure of preblocked rows: the validator and the batches read off it.

The validator finds anomalies in batches of rows, one code per position. Each block is read left
to right as a small state machine (a document is open or not):

    kind                  where it is reported
    out_of_vocab          an id outside [0, vocab_size) that is not [DOC], [EOD] or pad
    nested_doc            a [DOC] while a document is open (the new one opens)
    stray_eod             an [EOD] while no document is open
    unclosed_doc          a document still open at the end of the block (at its [DOC], or at 0
                          when it came in open); with carry_open_doc only at the end of the data
    content_outside_doc   the first token of a run outside any document (the run then counts as
                          an open document, so its [EOD] is not stray as well)
    marker_after_pad      a [DOC]/[EOD] right after padding
    pad_in_middle         any other non-pad token right after padding

``carry_open_doc``: a block that ends inside a document hands it to the next block, which then
starts inside it (no ``unclosed_doc`` for the first block, no ``content_outside_doc`` for the next);
a ``[DOC]`` at the start of that next block is then ``nested_doc``. A run of content outside any
document is not handed on.

``literal_heuristics`` down-ranks two ambiguous markers, exactly as the preblocked-chunks notes
state them; a down-ranked marker is reported as ``literal_doc``/``literal_eod`` (not an anomaly:
it does not count towards a failed validation) and otherwise read as text (no state change):

    H1 literal_doc: "A [DOC] appears while an open doc is active and is flanked only by
       structural/pad tokens" -- both neighbours are [DOC], [EOD] or pad (a block edge counts as
       such a flank).
    H2 literal_eod: "An [EOD] appears when no doc is open and no forthcoming [DOC] nearby" --
       no [DOC] among the next ``literal_window`` positions of the same block.

    block [D a E E P P], H2 with window 2: position 3 is literal_eod (no [DOC] in 4..5)
    block [D a E E D b E P]: position 3 is stray_eod (a [DOC] follows at distance 1)

A position carries one code; when several apply the first of ``out_of_vocab``, the padding
kinds, the structural kinds wins. Every block is scanned from both possible starting states at
once, one table lookup per position (``_RULES``); ``carry_open_doc`` then picks each block's start
from the blocks' state maps with one running maximum, so a batch is one pass however long the
chain of carried documents.

``block_batch`` reads segment ids and loss masks off the markers. A row is one block: documents
wrapped in markers, a document longer than the block cut at its edges, padding only at the tail.
Segment ids count the ``[DOC]`` markers up to each position (a row that opens inside a document
starts in segment 0); padding is segment ``-1``, its own. The loss mask is 1 where the next token
is a target of the same document: never on or before padding, never from an ``[EOD]``, never
across a segment change:

    tokens      = [c, E, D, a, b, E, P, P]      (D = [DOC], E = [EOD], P = pad; c continues a doc)
    segment_ids = [0, 0, 1, 1, 1, 1, -1, -1]
    loss_mask   = [1, 0, 1, 1, 1, 0, 0, 0]

``assemble_rows`` builds the same rows from a jagged token cache ("legacy" mode): each row is a few
pieces of documents, each piece a span of one document's slots (slot 0 is its ``[DOC]``, slot
``L + 1`` its ``[EOD]``, slot ``u`` in between its token ``u - 1``); markers are inserted here, the
tokens come from the fetched spans.
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ..batch import Batch
from ..scan import running_count

ANOMALY_KINDS: tuple[str, ...] = (
    "out_of_vocab",
    "nested_doc",
    "stray_eod",
    "unclosed_doc",
    "content_outside_doc",
    "marker_after_pad",
    "pad_in_middle",
    "literal_doc",
    "literal_eod",
)
CODE = {kind: code for code, kind in enumerate(ANOMALY_KINDS, start=1)}  # 0: nothing to report

# The state machine as a table. States: no document, a real one, a run of content outside any.
CLOSED, OPEN, IMPLICIT = 0, 1, 2
PAD, CONTENT, DOC, DOC_LITERAL, EOD, EOD_LITERAL = range(6)  # token kinds (literal: H1/H2 apply)
_RULES = {  # kind: [(next state, code, opens a document here) from CLOSED, OPEN, IMPLICIT]
    PAD: [(CLOSED, 0, 0), (OPEN, 0, 0), (IMPLICIT, 0, 0)],
    CONTENT: [(IMPLICIT, CODE["content_outside_doc"], 1), (OPEN, 0, 0), (IMPLICIT, 0, 0)],
    DOC: [(OPEN, 0, 1), (OPEN, CODE["nested_doc"], 1), (OPEN, CODE["nested_doc"], 1)],
    DOC_LITERAL: [(OPEN, 0, 1), (OPEN, CODE["literal_doc"], 0), (IMPLICIT, CODE["literal_doc"], 0)],
    EOD: [(CLOSED, CODE["stray_eod"], 0), (CLOSED, 0, 0), (CLOSED, 0, 0)],
    EOD_LITERAL: [(CLOSED, CODE["literal_eod"], 0), (CLOSED, 0, 0), (CLOSED, 0, 0)],
}
_TABLE = np.array(
    [nxt | code << 2 | opens << 6 for kind in range(6) for nxt, code, opens in _RULES[kind]], np.int32
)
LITERAL_KINDS = ("literal_doc", "literal_eod")


class Findings(eqx.Module):
    """What ``validate_blocks`` found in one batch.

    Attributes:
        codes: ``int32[blocks, block_size]``: ``CODE[kind]`` per position, 0 where clean.
        unclosed: ``int32[blocks]``: where a block's unclosed document opened, ``-1`` if none.
        carry_out: ``bool[]``: a document is open after the last valid block.
    """

    codes: Int[Array, "blocks block"]
    unclosed: Int[Array, " blocks"]
    carry_out: Bool[Array, ""]


def validate_blocks(
    blocks: Int[Array, "blocks block"],
    valid: Int[Array, ""],
    carry_in: Bool[Array, ""],
    final: Bool[Array, ""],
    *,
    doc_id: int,
    eod_id: int,
    pad_id: int,
    vocab_size: int,
    carry_open_doc: bool = False,
    literal_heuristics: bool = False,
    literal_window: int = 8,
) -> Findings:
    """Anomalies of a batch of blocks (see the module docstring).

    Jitted; only the shape of ``blocks`` selects a compilation: the ids and options travel as
    arrays, so every store and option set reuses it.

    Args:
        blocks: ``[blocks, block_size]`` token ids; rows from ``valid`` on are ignored (a last,
            short batch padded to the compiled shape).
        valid: ``int32[]`` rows that are real.
        carry_in: ``bool[]`` with ``carry_open_doc``: the previous batch ended inside a document.
        final: ``bool[]`` the batch holds the last block of the data (with ``carry_open_doc`` a
            document still open there is ``unclosed_doc``).
        doc_id, eod_id, pad_id, vocab_size: the structural ids; ordinary ids are
            ``[0, vocab_size)``.
        carry_open_doc, literal_heuristics, literal_window: the options (module docstring).

    Returns:
        ``Findings``.
    """
    config = jnp.array([doc_id, eod_id, pad_id, vocab_size, literal_window], jnp.int32)
    flags = jnp.array([carry_open_doc, literal_heuristics])
    return _validate(
        blocks, jnp.asarray(valid, jnp.int32), jnp.asarray(carry_in), jnp.asarray(final), config, flags
    )


@jax.jit
def _validate(
    blocks: Int[Array, "blocks block"],
    valid: Int[Array, ""],
    carry_in: Bool[Array, ""],
    final: Bool[Array, ""],
    config: Int[Array, "5"],
    flags: Bool[Array, "2"],
) -> Findings:
    """``validate_blocks`` with its ids and window as ``config`` and its options as ``flags``."""
    doc_id, eod_id, pad_id, vocab_size, literal_window = (config[i] for i in range(5))
    carry_open_doc, literal_heuristics = flags[0], flags[1]
    tokens = blocks.astype(jnp.int32)
    rows, block = tokens.shape
    position = jnp.arange(block, dtype=jnp.int32)
    is_doc, is_eod, is_pad = tokens == doc_id, tokens == eod_id, tokens == pad_id
    is_marker = is_doc | is_eod
    structural = is_marker | is_pad
    oov = ~structural & ((tokens < 0) | (tokens >= vocab_size))
    after_pad = ~is_pad & jnp.pad(is_pad[:, :-1], ((0, 0), (1, 0)))
    pad_code = jnp.where(after_pad, jnp.where(is_marker, CODE["marker_after_pad"], CODE["pad_in_middle"]), 0)
    edge = jnp.ones((rows, 1), bool)
    flanked = jnp.concatenate([edge, structural[:, :-1]], 1) & jnp.concatenate([structural[:, 1:], edge], 1)
    # a [DOC] among the next literal_window positions of the block: from running counts
    docs_so_far = running_count(is_doc)
    ahead = jnp.minimum(position + literal_window, block - 1)[None, :]
    doc_nearby = (
        jnp.take_along_axis(docs_so_far, jnp.broadcast_to(ahead, docs_so_far.shape), axis=1) > docs_so_far
    )
    literal_doc = is_doc & flanked & literal_heuristics
    literal_eod = is_eod & ~doc_nearby & literal_heuristics
    kind = jnp.select(
        [is_pad, literal_doc, is_doc, literal_eod, is_eod], [PAD, DOC_LITERAL, DOC, EOD_LITERAL, EOD], CONTENT
    )

    # Every block from both starting states (closed, open); carry_open_doc picks one per block
    # below. One table lookup per position: next state, code and whether a document opens here.
    def step(carry, x):
        state, opened_at = carry
        kind_at, pos = x
        entry = jnp.asarray(_TABLE)[kind_at[:, None] * 3 + state]
        return (entry & 3, jnp.where(entry >> 6 > 0, pos, opened_at)), (entry >> 2) & 15

    init = (
        jnp.broadcast_to(jnp.array([CLOSED, OPEN], jnp.int32), (rows, 2)),
        jnp.full((rows, 2), -1, jnp.int32),
    )
    (end_state, end_at), state_codes = jax.lax.scan(step, init, (kind.T, position))
    state_codes = jnp.moveaxis(state_codes, 0, 1)  # [rows, block, starts]
    end_open, end_implicit = end_state != CLOSED, end_state == IMPLICIT

    row = jnp.arange(rows, dtype=jnp.int32)
    real = row < valid
    # Block b maps its incoming state s to "a real document is open at its end"; rows past
    # `valid` map s to s. A run of stray content is not carried (it was reported already). A map
    # is the identity or a constant (a block can close an open document and open a closed one,
    # but never do one without the other for the same tokens), so the state after block b is
    # the value of the last constant map up to b, or the state carried in when there is none.
    maps = jnp.where(real[:, None], end_open & ~end_implicit, jnp.array([False, True])[None, :])
    constant = maps[:, 0] == maps[:, 1]
    last = _running_max(jnp.where(constant, row, -1))
    after = jnp.where(last >= 0, maps[jnp.maximum(last, 0), 0], carry_in)
    carried = jnp.concatenate([carry_in[None], after[:-1]])
    start = jnp.where(carry_open_doc, carried, False).astype(jnp.int32)
    carry_out = carry_open_doc & after[-1]
    report_end = jnp.where(carry_open_doc, final & (row == valid - 1), True)
    pick = partial(jnp.take_along_axis, indices=start[:, None], axis=1)
    structure = jnp.take_along_axis(state_codes, start[:, None, None], axis=2)[..., 0]
    codes = jnp.where(oov, CODE["out_of_vocab"], jnp.where(pad_code > 0, pad_code, structure))
    still_open = pick(end_open)[:, 0] & ~pick(end_implicit)[:, 0] & report_end & real
    unclosed = jnp.where(still_open, jnp.maximum(pick(end_at)[:, 0], 0), -1)
    return Findings(codes=jnp.where(real[:, None], codes, 0), unclosed=unclosed, carry_out=carry_out)


def _running_max(x: Int[Array, " n"]) -> Int[Array, " n"]:
    """Inclusive running maximum in ``log2(n)`` doubling steps (``lax.cummax`` lowers to an O(n)
    window per element on CPU)."""
    shift = 1
    while shift < x.shape[0]:
        x = jnp.maximum(x, jnp.concatenate([jnp.full((shift,), -1, x.dtype), x[:-shift]]))
        shift *= 2
    return x


@partial(jax.jit, static_argnames=("doc_id", "eod_id", "pad_id"))
def block_batch(tokens: Int[Array, "rows block"], *, doc_id: int, eod_id: int, pad_id: int) -> Batch:
    """A ``Batch`` of preblocked rows (see the module docstring): ``tokens`` ``[rows, block_size]``
    of any integer dtype in, int32 ``tokens``, ``loss_mask`` and ``segment_ids`` out."""
    tokens = tokens.astype(jnp.int32)
    block = tokens.shape[-1]
    is_pad = tokens == pad_id
    segment = jnp.where(is_pad, -1, running_count(tokens == doc_id))
    next_segment = jnp.concatenate([segment[:, 1:], jnp.full_like(segment[:, :1], -1)], axis=1)
    position = jnp.arange(block, dtype=jnp.int32)[None, :]
    loss = (position < block - 1) & ~is_pad & (tokens != eod_id) & (next_segment == segment)
    return Batch(tokens=tokens, loss_mask=loss.astype(jnp.int32), segment_ids=segment)


@partial(jax.jit, static_argnames=("block_size", "doc_id", "eod_id", "pad_id"))
def assemble_rows(
    buffer: Int[Array, " buffer"],
    offsets: Int[Array, "rows pieces"],
    row_start: Int[Array, "rows pieces"],
    slot_start: Int[Array, "rows pieces"],
    slots: Int[Array, "rows pieces"],
    doc_slots: Int[Array, "rows pieces"],
    *,
    block_size: int,
    doc_id: int,
    eod_id: int,
    pad_id: int,
) -> Int[Array, "rows block_size"]:
    """Rows of blocks from pieces of documents and their fetched tokens.

    Pieces of a row are sorted by ``row_start``; unused ones have ``slots == 0`` and come last.

    Args:
        buffer: fetched tokens; piece ``k``'s tokens begin at ``buffer[offsets[:, k]]`` and are the
            document's tokens from ``max(slot_start - 1, 0)`` on.
        offsets: ``int32[rows, pieces]`` where each piece's tokens lie in ``buffer``.
        row_start: ``int32[rows, pieces]`` position of the piece's first slot in the row.
        slot_start: ``int32[rows, pieces]`` the document slot at that position.
        slots: ``int32[rows, pieces]`` slots the piece covers in the row.
        doc_slots: ``int32[rows, pieces]`` the document's ``L + 2`` slots.
        block_size, doc_id, eod_id, pad_id: static.

    Returns:
        ``int32[rows, block_size]`` tokens with markers and padding in place.
    """
    position = jnp.arange(block_size, dtype=jnp.int32)
    used = slots > 0
    # the piece covering each position: the last used piece starting at or before it
    starts_before = (row_start[:, None, :] <= position[None, :, None]) & used[:, None, :]
    piece = jnp.sum(starts_before, axis=2, dtype=jnp.int32) - 1  # [rows, block]
    take = partial(jnp.take_along_axis, indices=jnp.maximum(piece, 0), axis=1)
    start, first, count, size = take(row_start), take(slot_start), take(slots), take(doc_slots)
    covered = (piece >= 0) & (position[None, :] < start + count)
    slot = first + position[None, :] - start
    index = take(offsets) + slot - 1 - jnp.maximum(first - 1, 0)
    content = buffer[jnp.clip(index, 0, buffer.shape[0] - 1)].astype(jnp.int32)
    token = jnp.where(slot == 0, doc_id, jnp.where(slot == size - 1, eod_id, content))
    return jnp.where(covered, token, jnp.int32(pad_id))
