"""Provenance equals what the batch holds: every row of several steps rebuilt from its
provenance (the named token ranges read straight from the caches and stores) and compared with
the batch, for every dataset kind, on 1 and 8 devices, at step 0 and past 2^32 examples."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from corpora import random_docs, write_docs
from meshes import mesh_of
from packed_corpus import chat_examples, supervised_examples, write_chat_cache, write_supervised_cache

from meshbatch import Mixture, PackedDataset, Pipeline, ShuffleSpec, TokenBalancedMixture
from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.datasets import CausalLMDataset, SpliceLMDataset
from meshbatch.datasets.preblocked import PackSpec, preblock
from meshbatch.datasets.preblocked.block_dataset import BlockDataset, CacheBlockDataset
from meshbatch.datasets.provenance import content_fingerprint, source_name
from meshbatch.pipeline.telemetry import read_counters

EOS, PAD = 1, 0
SEQ, BATCH = 16, 16
BIG = 2**32 // BATCH + 3  # a step whose rows are past stream index 2^32
STEPS = (0, 1, BIG)
IDS = dict(doc_id=257, eod_id=258, pad_id=259, vocab_size=257)
SPLICE = dict(seq_len=SEQ, pad_token_id=PAD, eos_token_id=EOS)
SPLICE_FILL = {PAD, EOS}  # what a splice frame holds outside its copy
BLOCK_FILL = {IDS["doc_id"], IDS["eod_id"], IDS["pad_id"]}
PACKED_PAD = 0  # a packed row's padding token (its examples' tokens are 3..999)


@pytest.fixture(scope="module")
def second_cache(tmp_path_factory):
    docs = random_docs(np.random.default_rng(1), 60, (20_000, 30_000), (3, 90), eos=EOS)
    return write_docs(tmp_path_factory.mktemp("provenance") / "cache_b", docs)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("provenance_blocks")
    text = root / "docs.jsonl"
    rng = np.random.default_rng(2)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    with open(text, "w") as f:
        for _ in range(60):
            f.write(json.dumps({"text": " ".join(rng.choice(words, rng.integers(2, 30)))}) + "\n")
    path = str(root / "store")
    preblock(path, [str(text)], block_size=32, key=BlockDataset.pack_key(7), text_docs="line", progress=False)
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A generated chat and supervised cache (examples of 2..40 tokens: many longer than SEQ)."""
    root = tmp_path_factory.mktemp("provenance_packed")
    return {
        "chat": write_chat_cache(root / "chat", chat_examples(3, 80, max_len=40)),
        "supervised": write_supervised_cache(root / "supervised", supervised_examples(4, 80, max_len=40)),
    }


def datasets(cache_path, second_cache, store, packed):
    """kind -> (dataset, {component: tokens a row may hold outside its spans})."""
    a, b = TokenCache.open(cache_path), TokenCache.open(second_cache)
    causal_a = CausalLMDataset(a, SEQ, shuffle=ShuffleSpec("full"), eos_id=EOS)
    causal_b = CausalLMDataset(b, SEQ, shuffle=ShuffleSpec("era", era_length=8), eos_id=EOS)
    pool = SpliceLMDataset.from_cache(a, np.arange(5, 45), pool=True, **SPLICE)
    fetched = SpliceLMDataset.from_cache(b, np.arange(0, 60, 2), pool=False, **SPLICE)
    cyclic = SpliceLMDataset.from_cache(a, np.arange(100, 130), content_start_mode="cyclic_roll", **SPLICE)
    return {
        "causal": (causal_a, {"": set()}),
        "splice_pool": (pool, {"": SPLICE_FILL}),
        "splice_fetch": (fetched, {"": SPLICE_FILL}),
        "splice_cyclic": (cyclic, {"": SPLICE_FILL}),
        "stable_mixture": (
            Mixture({"a": causal_a, "b": causal_b, "s": pool}, {"a": 0.5, "b": 0.3, "s": 0.2}, block_size=8),
            {"a": set(), "b": set(), "s": SPLICE_FILL},
        ),
        "token_balanced": (
            TokenBalancedMixture({"a": causal_a, "s": fetched}),
            {"a": set(), "s": SPLICE_FILL},
        ),
        "preblocked": (BlockDataset(store, shuffle=ShuffleSpec("full")), {"": set()}),
        "packed_on_the_fly": (
            CacheBlockDataset(
                os.path.join(store, "tokens"), shuffle=ShuffleSpec("full"), pack=PackSpec(32), **IDS
            ),
            {"": BLOCK_FILL},
        ),
        # the default policy: a keyed shuffle of the examples, first fit, a full shuffle of the
        # packed rows; long chat examples keep their first SEQ tokens, supervised ones their last
        "packed": (
            PackedDataset(packed["chat"], SEQ, window=16, attention_metadata=True),
            {"": {PACKED_PAD}},
        ),
        "packed_supervised": (
            PackedDataset(
                packed["supervised"], SEQ, max_segments=3, shuffle=ShuffleSpec("era", era_length=4)
            ),
            {"": {PACKED_PAD}},
        ),
    }


KINDS = (
    "causal",
    "splice_pool",
    "splice_fetch",
    "splice_cyclic",
    "stable_mixture",
    "token_balanced",
    "preblocked",
    "packed_on_the_fly",
    "packed",
    "packed_supervised",
)


def read_span(sources: dict, name: str, start: int, length: int, field: str = "input_ids") -> np.ndarray:
    """Tokens ``[start, start + length)`` of the source named ``name``, read from it directly
    (``field``: another field of the same cache, as a packed chat cache's ``assistant_masks``)."""
    source = sources[name]
    if isinstance(source, TokenCache):
        if field != source.field:  # the same ranges of another field of the cache, opened once
            source = sources.setdefault((name, field), TokenCache.open(source.path, field))
        return np.asarray(source.read_spans([start], [length])[0])
    size = source.block_size  # a preblocked store: whole blocks
    assert start % size == 0 and length == size
    return np.asarray(source.read_blocks([start // size])[0])


def check_doc(sources: dict, name: str, doc: int, doc_start: int, start: int) -> None:
    offsets = getattr(sources[name], "doc_offsets", None)
    if offsets is None:  # a preblocked store: the row is the block
        assert doc == start // sources[name].block_size and doc_start == 0
        return
    offsets = offsets()
    assert offsets[doc] + doc_start == start and 0 <= doc_start < offsets[doc + 1] - offsets[doc]


def sources_by_name(host) -> dict:
    """The sources provenance names, by name: a cache's tokens (a packed chat cache's
    ``assistant_masks`` field shares its path: provenance names its ``input_ids``)."""
    sources = {}
    for s in host.sources:
        if getattr(s, "field", "input_ids") == "input_ids":
            sources.setdefault(source_name(s), s)
    return sources


def check_packed_leaves(sources: dict, host: PackedDataset, prov, batch, step: int) -> None:
    """A packed row's other leaves from its provenance: each span's ``doc`` is its segment id, its
    positions count from 0, its loss mask is the named range's supervision (the same range of
    ``assistant_masks``, or ``sources_len`` of the named row counted from the example's first
    token: ``doc_start`` tokens were sliced off); padding is segment -1, loss 0, position 0."""
    segments, loss = np.asarray(batch.segment_ids), np.asarray(batch.loss_mask)
    positions = None if batch.positions is None else np.asarray(batch.positions)
    for row in range(segments.shape[0]):
        want_seg = np.full(segments.shape[1], -1)
        want_loss = np.zeros(segments.shape[1], np.int32)
        want_pos = np.zeros(segments.shape[1], np.int32)
        for j, name, start, length, at in row_spans(prov, row):
            doc, cut = int(prov.rows.doc[row, j]), int(prov.rows.doc_start[row, j])
            want_seg[at : at + length] = doc
            want_pos[at : at + length] = np.arange(length)
            if host.format == "chat":
                supervised = read_span(sources, name, start, length, "assistant_masks")[1:] == 1
            else:  # the completion: tokens from sources_len of the whole example on
                supervised = cut + np.arange(1, length) >= host.examples.sources_len[doc]
            want_loss[at : at + length - 1] = supervised  # no loss on an example's last token
        np.testing.assert_array_equal(segments[row], want_seg, err_msg=f"step {step} row {row} segment_ids")
        np.testing.assert_array_equal(loss[row], want_loss, err_msg=f"step {step} row {row} loss_mask")
        if positions is not None:
            np.testing.assert_array_equal(
                positions[row], want_pos, err_msg=f"step {step} row {row} positions"
            )


def row_spans(prov, row: int):
    """``(slot, source name, start, length, place in the row)`` of each non-empty span of ``row``."""
    rows = prov.rows
    for j in range(rows.slots):
        length = int(rows.length[row, j])
        if length:
            yield j, rows.source[row, j], int(rows.start[row, j]), length, int(rows.row_offset[row, j])


def rebuild_and_compare(pipeline: Pipeline, step: int, fills: dict, state=None) -> int:
    """Checks every row of ``step`` against its provenance; returns the spans compared."""
    before = read_counters(pipeline._host)
    prov = pipeline.provenance(step, state=state)
    assert read_counters(pipeline._host) == before  # provenance reads no token
    full = pipeline.batch(step)
    batch = np.asarray(full.tokens)
    sources = sources_by_name(pipeline._host)
    for s in _doc_sources(pipeline._host):
        sources.setdefault(source_name(s), s)
    offset = pipeline.schedule.offset(step)
    assert list(prov.stream_index) == [offset + r for r in range(len(prov))]
    n = prov.rows.length.shape[0]
    spans = 0
    for row in range(n):
        covered = np.zeros(batch.shape[1], bool)
        for j, name, start, length, at in row_spans(prov, row):
            np.testing.assert_array_equal(
                batch[row, at : at + length],
                read_span(sources, name, start, length),
                err_msg=f"step {step} row {row} span {j}",
            )
            check_doc(sources, name, int(prov.rows.doc[row, j]), int(prov.rows.doc_start[row, j]), start)
            assert not covered[at : at + length].any()
            covered[at : at + length] = True
            spans += 1
        component = prov.rows.component[row]
        allowed = fills[component]
        assert set(batch[row, ~covered].tolist()) <= allowed, (step, row, component, batch[row, ~covered])
    if isinstance(pipeline._host, PackedDataset):
        check_packed_leaves(sources, pipeline._host, prov, full, step)
    return spans


def _doc_sources(dataset):
    """The caches a dataset's documents come from (splice selections held in a pool too)."""
    for child in getattr(dataset, "children", [dataset]):
        if getattr(child, "doc_source", None) is not None:
            yield child.doc_source
        yield from (_doc_sources(child) if getattr(child, "children", None) else ())


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_every_row_is_rebuilt_from_its_provenance(kind, devices, cache_path, second_cache, store, packed):
    dataset, fills = datasets(cache_path, second_cache, store, packed)[kind]
    pipeline = Pipeline(dataset, mesh=mesh_of(devices), batch_size=BATCH, key=7, warmup=False)
    spans = 0
    if kind != "token_balanced":
        for step in STEPS:
            spans += rebuild_and_compare(pipeline, step, fills)
    else:  # stateful: step 0, 1 from the pipeline's states; past 2^32 rows from a checkpoint's state
        spans += rebuild_and_compare(pipeline, 0, fills) + rebuild_and_compare(pipeline, 1, fills)
        saved = {
            "version": 1,
            "step": BIG,
            "datasets": [
                {"spec": "a", "row_offset": 3 * 2**31 + 5, "token_offset": 3 * 2**31 * SEQ + 80},
                {"spec": "s", "row_offset": 2**31 + 7, "token_offset": 2**31 * 13 + 9},
            ],
        }
        expected = pipeline.provenance(BIG, state=saved)
        pipeline.load_state_dict(saved)
        spans += rebuild_and_compare(pipeline, BIG, fills, state=saved)
        again = pipeline.provenance(BIG)  # from the state it now holds
        np.testing.assert_array_equal(again.rows.start, expected.rows.start)
        with pytest.raises(ValueError, match="differs from the state's step"):
            pipeline.provenance(BIG + 1, state=saved)
    assert spans >= len(STEPS) * BATCH


def test_records_name_component_source_document_and_range(cache_path, second_cache, store, packed):
    dataset, _ = datasets(cache_path, second_cache, store, packed)["stable_mixture"]
    pipeline = Pipeline(dataset, mesh=mesh_of(1), batch_size=BATCH, key=7, warmup=False)
    records = pipeline.provenance(BIG).records()
    assert len(records) == BATCH and records[0]["stream_index"] == BIG * BATCH
    assert {r["component"] for r in records} <= {"a", "b", "s"}
    for r in records:
        assert r["spans"] and all(s["source"] in (cache_path, second_cache) for s in r["spans"])
    json.dumps(records)


def test_the_content_fingerprint_follows_caches_and_weights(
    cache_path, second_cache, store, packed, tmp_path
):
    kinds = datasets(cache_path, second_cache, store, packed)
    mixture = kinds["stable_mixture"][0]
    again = datasets(cache_path, second_cache, store, packed)["stable_mixture"][0]
    assert content_fingerprint(mixture) == content_fingerprint(again) == mixture.content_fingerprint()
    causal_a, causal_b, pool = mixture.children
    reweighted = Mixture(
        {"a": causal_a, "b": causal_b, "s": pool}, {"a": 0.4, "b": 0.4, "s": 0.2}, block_size=8
    )
    assert content_fingerprint(reweighted) != content_fingerprint(mixture)
    # the same documents written again (a re-bucketed corpus has a new cache_id)
    path = str(tmp_path / "rewritten")
    source = TokenCache.open(second_cache)
    with CacheWriter(path) as writer:
        writer.write(source.read_rows(np.arange(source.num_rows)))
    rewritten = CausalLMDataset(
        TokenCache.open(path), SEQ, shuffle=ShuffleSpec("era", era_length=8), eos_id=EOS
    )
    moved = Mixture({"a": causal_a, "b": rewritten, "s": pool}, {"a": 0.5, "b": 0.3, "s": 0.2}, block_size=8)
    assert content_fingerprint(moved) != content_fingerprint(mixture)
    pipeline = Pipeline(mixture, mesh=mesh_of(1), batch_size=BATCH, key=7, warmup=False)
    assert pipeline.content_fingerprint() == content_fingerprint(mixture)


def test_provenance_refuses_a_state_for_a_stateless_dataset_and_steps_past_the_end(
    cache_path, second_cache, store, packed
):
    dataset, _ = datasets(cache_path, second_cache, store, packed)["causal"]
    pipeline = Pipeline(dataset, mesh=mesh_of(1), batch_size=BATCH, key=7, warmup=False, max_epochs=1)
    with pytest.raises(ValueError, match="stateless"):
        pipeline.provenance(0, state={"version": 1, "step": 0})
    with pytest.raises(IndexError, match="past the end"):
        pipeline.provenance(pipeline.num_steps())


def test_the_cli_prints_each_rows_provenance_and_the_fingerprint(cache_path, tmp_path, monkeypatch, capsys):
    from meshbatch.cli import main

    (tmp_path / "provenance_factory.py").write_text(
        "import jax, numpy as np\n"
        "from meshbatch import Pipeline, ShuffleSpec\n"
        "from meshbatch.cache import TokenCache\n"
        "from meshbatch.datasets import CausalLMDataset\n"
        "def make():\n"
        f"    cache = TokenCache.open({cache_path!r})\n"
        f"    dataset = CausalLMDataset(cache, {SEQ}, shuffle=ShuffleSpec('full'))\n"
        "    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))\n"
        f"    return Pipeline(dataset, mesh=mesh, batch_size={BATCH}, key=3, warmup=False)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert (
        main(["provenance", "provenance_factory:make", "--step", "5", "--step", str(BIG), "--fingerprint"])
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    import provenance_factory

    pipeline = provenance_factory.make()
    assert lines[0] == {"content_fingerprint": pipeline.content_fingerprint()}
    assert lines[1:] == pipeline.provenance(5).records() + pipeline.provenance(BIG).records()
    assert main(["provenance", "provenance_factory", "--step", "1"]) == 1
    assert "must be module:function" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["stable_mixture", "packed_on_the_fly"])
def test_a_pipeline_logs_its_content_fingerprint(kind, cache_path, second_cache, store, packed, caplog):
    dataset, _ = datasets(cache_path, second_cache, store, packed)[kind]
    with caplog.at_level("INFO", logger="meshbatch.pipeline.pipeline"):
        pipeline = Pipeline(dataset, mesh=mesh_of(1), batch_size=BATCH, key=7, warmup=False)
    assert f"content fingerprint {pipeline.content_fingerprint()}" in caplog.text
    assert "Logging error" not in caplog.text


def test_a_padded_final_steps_zero_rows_have_no_provenance(cache_path, second_cache, store, packed):
    dataset, _ = datasets(cache_path, second_cache, store, packed)["causal"]
    pipeline = Pipeline(
        dataset, mesh=mesh_of(8), batch_size=BATCH, key=7, warmup=False, max_epochs=1, pad_final_batch=True
    )
    last = pipeline.num_steps() - 1
    real = dataset.num_examples - pipeline.schedule.offset(last)
    assert 0 < real < BATCH  # the cache's windows end inside the last step
    prov = pipeline.provenance(last)
    assert prov.padding.tolist() == [row >= real for row in range(BATCH)]
    assert (prov.rows.length[real:] == 0).all() and (prov.rows.length[:real] == SEQ).all()
    assert all(not r["spans"] for r in prov.records()[real:])
    assert rebuild_and_compare(pipeline, last, {"": {0}}) == real  # padding rows: zeros only
