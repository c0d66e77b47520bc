"""The structure validator: one damaged block per kind, the seed's two options on hand-made cases,
the shuffle-level trade-off, the plain-Python reference, the CLI and its anomalies JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from corpora import preblocked_per_level, topic_texts, write_jsonl
from preblock_reference import validate

from meshbatch.cli import main
from meshbatch.datasets.preblocked.block_validation import validate_array, validate_path
from meshbatch.kernels.internal import ANOMALY_KINDS as KINDS

D, E, P, V = 257, 258, 259, 257  # [DOC], [EOD], pad, vocabulary size
IDS = dict(doc_id=D, eod_id=E, pad_id=P, vocab_size=V)

CLEAN = [D, 1, 2, E, D, 3, E, P]
DAMAGED = {  # one defect each: (block, the position it is reported at)
    "out_of_vocab": ([D, 1, 300, E, P, P, P, P], 2),
    "nested_doc": ([D, 1, D, 2, E, P, P, P], 2),
    "stray_eod": ([D, 1, E, E, D, 2, E, P], 3),
    "unclosed_doc": ([D, 1, 2, 3, P, P, P, P], 0),
    "content_outside_doc": ([1, 2, E, D, 3, E, P, P], 0),
    "marker_after_pad": ([D, 1, E, P, D, 2, E, P], 4),
    "pad_in_middle": ([D, 1, P, 2, E, P, P, P], 3),
}


def found(blocks, **options) -> list[tuple[int, int, str]]:
    report = validate_array(np.array(blocks), **IDS, **options)
    return sorted((a.block, a.position, a.kind) for a in report.anomalies)


def counts(blocks, **options) -> dict[str, int]:
    report = validate_array(np.array(blocks), **IDS, **options)
    return {kind: n for kind, n in report.counts.items() if n}


def test_every_damaged_block_found_and_nothing_else():
    blocks = [CLEAN, *(block for block, _ in DAMAGED.values()), CLEAN]
    want = sorted((i + 1, at, kind) for i, (kind, (_, at)) in enumerate(DAMAGED.items()))
    assert found(blocks) == want
    assert set(DAMAGED) | {"literal_doc", "literal_eod"} == set(KINDS)
    assert found([CLEAN] * 5) == []


def test_carry_open_doc():
    # a document continued into the next block: two anomalies without carrying, none with
    split = [[D, 1, 2, 3, 4, 5, 6, 7], [8, 9, E, D, 1, E, P, P]]
    assert found(split) == [(0, 0, "unclosed_doc"), (1, 0, "content_outside_doc")]
    assert found(split, carry_open_doc=True) == []
    # the next block does not continue it: a false boundary, reported at the next block's [DOC]
    broken = [[D, 1, 2, 3, 4, 5, 6, 7], [D, 2, E, P, P, P, P, P]]
    assert found(broken) == [(0, 0, "unclosed_doc")]
    assert found(broken, carry_open_doc=True) == [(1, 0, "nested_doc")]
    # still open at the end of the data
    assert found([[8, 9, E, D, 1, 2, 3, 4]], carry_open_doc=True) == [
        (0, 0, "content_outside_doc"),
        (0, 3, "unclosed_doc"),
    ]
    # carried across kernel batches
    assert found(split * 3, carry_open_doc=True, batch_blocks=5) == []


def test_literal_heuristics_exactly_as_the_seed_states_them():
    # H1: "A [DOC] appears while an open doc is active and is flanked only by structural/pad tokens"
    doc_text_is_marker = [D, D, E, D, 1, E, P, P]  # a document whose text is literally "[DOC]"
    assert counts([doc_text_is_marker]) == {"nested_doc": 1}
    assert counts([doc_text_is_marker], literal_heuristics=True) == {"literal_doc": 1}
    flanked_by_text = [D, 1, D, 2, E, P, P, P]
    assert counts([flanked_by_text], literal_heuristics=True) == {"nested_doc": 1}
    # H2: "An [EOD] appears when no doc is open and no forthcoming [DOC] nearby"
    trailing = [D, 1, E, E, P, P, P, P]
    assert counts([trailing]) == {"stray_eod": 1}
    assert counts([trailing], literal_heuristics=True) == {"literal_eod": 1}
    doc_follows = [D, 1, E, E, D, 2, E, P]
    assert counts([doc_follows], literal_heuristics=True) == {"stray_eod": 1}
    # "nearby" is literal_window positions: here the next [DOC] is 4 after the stray [EOD]
    far = [D, 1, E, E, 5, 6, E, D]
    base = {"content_outside_doc": 1, "unclosed_doc": 1}
    assert counts([far], literal_heuristics=True, literal_window=3) == {**base, "literal_eod": 1}
    assert counts([far], literal_heuristics=True, literal_window=4) == {**base, "stray_eod": 1}
    report = validate_array(np.array([trailing]), **IDS, literal_heuristics=True)
    assert report.ok  # a down-ranked marker is not an anomaly


@pytest.mark.parametrize("seed", range(4))
def test_kernel_equals_python_reference(seed):
    rng = np.random.default_rng(seed)
    blocks = rng.choice(
        [D, E, P, 1, 2, 3, 300, -1], size=(23, 8), p=[0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05]
    )
    for carry in (False, True):
        for heuristics in (False, True):
            options = dict(carry_open_doc=carry, literal_heuristics=heuristics, literal_window=2)
            assert found(blocks, batch_blocks=5, **options) == validate(blocks, **IDS, **options)


@pytest.fixture(scope="module")
def shuffled_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("validate")
    text = write_jsonl(root / "topics.jsonl", topic_texts(40, chars=3000))
    return preblocked_per_level(root, text, block_size=64, key=1)


def test_shuffle_level_trade_off(shuffled_stores):
    # document: documents shuffled whole, continuation blocks adjacent -> clean with carry_open_doc
    document = validate_path(shuffled_stores["document"], carry_open_doc=True, progress=False)
    assert document.ok
    plain = validate_path(shuffled_stores["document"], progress=False)
    split = json.load(open(f"{shuffled_stores['document']}/preblock.json"))["counts"]["split_documents"]
    assert plain.counts["unclosed_doc"] == split  # without carrying, every split document
    # segment: blocks shuffled after packing -> continuations land elsewhere: false boundary errors
    segment = validate_path(shuffled_stores["segment"], carry_open_doc=True, progress=False)
    assert not segment.ok and segment.counts["nested_doc"] + segment.counts["content_outside_doc"] > 0


def test_cli_exit_codes_and_anomalies_json(shuffled_stores, tmp_path, capsys):
    store = shuffled_stores["document"]
    assert main(["validate-blocks", store, "--carry-open-doc", "--no-progress"]) == 0
    out = tmp_path / "anomalies.json"
    assert main(["validate-blocks", store, "--no-progress", "--anomalies", str(out)]) == 1
    report = json.loads(out.read_text())
    assert set(report) == {"path", "blocks", "ok", "options", "counts", "anomalies"}
    assert set(report["counts"]) == set(KINDS)
    first = report["anomalies"][0]
    assert set(first) == {"block", "position", "kind", "heuristic", "severity", "context_start", "tokens"}
    assert first["kind"] in KINDS and first["heuristic"] is None and first["severity"] == "anomaly"
    # hand-made literal cases in a chunk*.npy directory (no header: ids on the command line)
    chunks = tmp_path / "chunks"
    chunks.mkdir()
    np.save(chunks / "chunk0.npy", np.array([[D, 1, E, E, P, P, P, P], CLEAN]))
    ids = ["--doc-id", str(D), "--eod-id", str(E), "--pad-id", str(P), "--vocab-size", str(V)]
    assert main(["validate-blocks", str(chunks), *ids, "--no-progress"]) == 1
    lit = tmp_path / "literal.json"
    args = [str(chunks), *ids, "--literal-heuristics", "--literal-window", "4", "--anomalies", str(lit)]
    assert main(["validate-blocks", *args, "--no-progress"]) == 0
    (literal,) = json.loads(lit.read_text())["anomalies"]
    assert literal["kind"] == "literal_eod" and literal["severity"] == "literal"
    assert literal["heuristic"].startswith("H2") and "4 positions" in literal["heuristic"]
    assert (literal["block"], literal["position"], literal["context_start"]) == (0, 3, 0)
    assert literal["tokens"] == [D, 1, E, E, P, P, P, P]
    # unreadable input: exit 2
    assert main(["validate-blocks", str(tmp_path / "missing")]) == 2
    assert main(["validate-blocks", str(chunks)]) == 2  # no header and no ids
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "chunk0.npy").write_bytes(b"not numpy")
    assert main(["validate-blocks", str(tmp_path / "bad"), *ids]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_one_compilation_serves_every_store_and_option_set():
    from compiles import count_compiles

    found([CLEAN] * 3)  # compiled for [1024, 8] blocks
    with count_compiles() as compiles:
        for options in ({}, {"carry_open_doc": True}, {"literal_heuristics": True, "literal_window": 3}):
            found([block for block, _ in DAMAGED.values()], **options)
        validate_array(np.array([CLEAN]), doc_id=10, eod_id=11, pad_id=12, vocab_size=9)
    assert compiles == []


@pytest.mark.parametrize("bad", [2**32 + 5, 2**32 + D, 2**32 + P, -(2**32) + 7, 2**31])
def test_an_id_past_int32_is_refused_never_wrapped(bad):
    """The seed's chunks are int64: an id past int32 wrapped to a plausible one (2^32 + 5 -> 5:
    reported ok; 2^32 + [DOC] -> a nested [DOC]) before the checks. Now refused by position."""
    blocks = np.array([[D, 1, 2, E, P, P, P, P], [D, 1, bad, E, P, P, P, P]], np.int64)
    with pytest.raises(ValueError, match=rf"blocks\[1, 2\] = {bad}\)"):
        validate_array(blocks, doc_id=D, eod_id=E, pad_id=P, vocab_size=V)
