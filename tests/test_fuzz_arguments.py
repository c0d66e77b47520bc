"""Random bad arguments at the public entry points: every failure is a ``TypeError``,
``ValueError`` or ``IndexError`` that names the parameter, never an internal error from deep
inside jax or numpy, and never a silent acceptance of a wrong type (a path or cache field that is
not there: a ``FileNotFoundError`` that names it).

Each trial takes a valid call, replaces one argument with a value from ``BAD``, and calls. A call
may succeed when the value happens to be acceptable (``None`` for an optional argument); otherwise
the error must be one of the three and mention the parameter (or one of its aliases). The trials
are a deterministic grid (``grid``): every parameter of every call with every value of ``BAD``,
so a run's work is fixed, not a time budget.

The entry points run with the shape checks off (``unchecked``): the errors asserted are the ones
a user sees, which a checker's ``TypeCheckError`` would otherwise pre-empt at the kernels.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from argument_fuzz import ALLOWED, BAD, Call, grid
from shape_checks import unchecked

import meshbatch
from meshbatch import BatchSchedule, CausalLMDataset, Pipeline, ShuffleSpec, SpliceLMDataset
from meshbatch.cache import BlockCache, CacheWriter, TokenCache
from meshbatch.datasets.preblocked import MLMMasking
from meshbatch.datasets.preblocked.block_validation import validate_array


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fuzz") / "cache")
    with CacheWriter(path) as writer:
        writer.write([np.arange(2, 200, dtype=np.int32), np.arange(5, 300, dtype=np.int32)])
    cache = TokenCache.open(path)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    docs = [np.arange(3, 60, dtype=np.int32), np.arange(7, 40, dtype=np.int32)]
    splice = dict(seq_len=16, content_length=8, content_start_mode="coverage_balanced", alpha=0.5)
    schedule = meshbatch.splice_schedule([57, 33], **splice)
    perm = meshbatch.permutation("feistel", 100, 0)
    data = meshbatch.SpliceDataset(docs, pad_token_id=0, **splice)
    pipeline = Pipeline(CausalLMDataset(cache, 16), mesh=mesh, batch_size=4, key=0)
    return {
        "permutation": Call(
            lambda kind, length, key, compat: meshbatch.permutation(kind, length, key, compat=compat),
            kind="feistel",
            length=100,
            key=0,
            compat=None,
        ),
        "era_shuffle": Call(
            meshbatch.era_shuffle, length=100, era_length=10, key=0, kind="linear", compat=None
        ),
        "block_shuffle": Call(
            meshbatch.block_shuffle, length=100, io_block_size=8, window_blocks=4, key=0, compat="levanter"
        ),
        "shuffle call": Call(
            lambda indices, epoch: perm(indices, epoch=epoch),
            {"indices": ("index",)},
            indices=np.arange(4),
            epoch=1,
        ),
        "ShuffleSpec": Call(
            ShuffleSpec, strategy="era", era_length=10, kind="feistel", reshuffle_each_epoch=True
        ),
        "BatchSchedule": Call(BatchSchedule, {"schedule": ("batch_size",)}, schedule=[(0, 8), (4, 16)]),
        "splice_schedule": Call(
            lambda doc_lengths, **kw: meshbatch.splice_schedule(doc_lengths, **kw),
            doc_lengths=[57, 33],
            seq_len=16,
            content_length=8,
            content_start_mode="coverage_balanced",
            alpha=0.5,
            offset_jitter=2,
            jitter_mode="uniform",
            balance_tau=0.5,
            balance_mode="by_temperature",
            epoch_length=40,
            shuffle_per_epoch=True,
            adaptive_k=True,
            min_copy_len=2,
            key=0,
        ),
        "schedule.lookup": Call(
            lambda rows, epoch: schedule.lookup(rows, epoch), {"rows": ("row",)}, rows=np.arange(3), epoch=0
        ),
        "SpliceDataset": Call(
            lambda docs, **kw: meshbatch.SpliceDataset(docs, **kw),
            {"docs": ("document",)},
            docs=docs,
            seq_len=16,
            pad_token_id=0,
            eos_token_id=1,
            content_length=8,
            content_start_mode="slide_within",
            content_stride=2,
            offset_stride=3,
            shuffle_offsets=True,
            key=3,
        ),
        "get_batch": Call(data.get_batch, indices=np.arange(5)),
        "frames_at": Call(data.frames_at, doc=0, t=1, s=2),
        "SpliceLMDataset.from_cache": Call(
            lambda indices, **kw: SpliceLMDataset.from_cache(cache, indices, **kw),
            {"indices": ("document",)},
            indices=[0, 1],
            pool=False,
            seq_len=16,
            pad_token_id=0,
        ),
        "select_documents": Call(
            meshbatch.select_documents,
            doc_lengths=[5, 40, 12, 40, 7],
            num_docs=2,
            min_doc_length=3,
            max_doc_length=100,
            doc_select_mode="random",
            key=0,
        ),
        "shard_indices": Call(
            lambda local_indices, **kw: meshbatch.shard_indices(local_indices, **kw),
            local_indices=np.arange(4),
            process_index=1,
            process_count=3,
        ),
        "coverage_counts": Call(
            lambda doc, **kw: meshbatch.coverage_counts(schedule, doc, **kw), doc=1, epoch=0
        ),
        "CausalLMDataset": Call(
            lambda seq_len, **kw: CausalLMDataset(cache, seq_len, **kw),
            seq_len=16,
            shuffle=ShuffleSpec("era", era_length=4),
            eos_id=1,
            ignore_id=0,
        ),
        "Pipeline": Call(
            lambda **kw: Pipeline(CausalLMDataset(cache, 16), **kw),
            mesh=mesh,
            batch_size=4,
            key=0,
            data_axes="data",
            prefetch=2,
            workers=1,
            max_epochs=3,
            stages=(),
        ),
        "Pipeline.batch": Call(pipeline.batch, step=3),
        "TokenCache.open": Call(TokenCache.open, path=path, field="input_ids", require_finished=True),
        "read_spans": Call(cache.read_spans, starts=[0, 16], lengths=[4, 4]),
        "BlockCache": Call(BlockCache, max_bytes=1 << 20, block_tokens=1024),
    }


def test_bad_arguments_raise_named_errors(calls):
    failures, tried = [], 0
    with unchecked():
        for name, param, bad in grid(calls):
            call = calls[name]
            kwargs = dict(call.kwargs, **{param: bad})
            tried += 1
            try:
                jax.block_until_ready(call.fn(**kwargs))
            except ALLOWED as error:
                if not any(alias in str(error) for alias in call.names(param)):
                    failures.append(f"{name}({param}={bad!r}): {type(error).__name__}: {error}")
            except Exception as error:
                failures.append(f"{name}({param}={bad!r}): internal {type(error).__name__}: {error}")
    assert tried == len(BAD) * sum(len(call.kwargs) for call in calls.values())
    assert not failures, "\n".join(sorted(failures)[:25])


def _perm(*args, **kwargs):
    return meshbatch.permutation("feistel", 10, 0)(*args, **kwargs)


def _schedule(**spec):
    return meshbatch.splice_schedule([50], **{"seq_len": 8, **spec})


def _lookup(rows):
    spec = dict(seq_len=6, content_length=3, content_start_mode="slide_within")
    return meshbatch.splice_schedule([9], **spec).lookup(rows)


@pytest.mark.parametrize(
    ("call", "match", "error"),
    [
        (lambda: _perm(np.array([1.5])), "must be integers", TypeError),
        (lambda: _perm(np.arange(3), epoch=-1), "epoch -1", ValueError),
        (lambda: _perm(np.arange(3), epoch=2**32), "epoch 4294967296", ValueError),
        (
            lambda: _perm(np.arange(3), epoch=np.arange(2)),
            "epoch must be a scalar or broadcast to the indices. shape",
            ValueError,
        ),
        (
            lambda: meshbatch.permutation("feistel", 10, jnp.zeros((3, 2), jnp.uint32)),
            "a batch of keys",
            ValueError,
        ),
        (lambda: _schedule(adaptive_k="no"), "adaptive_k must be a bool", TypeError),
        (lambda: _schedule(pad_token_id=2**31), "pad_token_id must be <=", ValueError),
        (lambda: _schedule(seq_len=2**70), "seq_len must be <=", ValueError),
        (lambda: _lookup(np.array([40])), "row 40 is out of range", IndexError),
    ],
)
def test_specific_bad_values(call, match, error):
    with unchecked(), pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    ("name", "param", "value", "match", "error"),
    [
        ("Pipeline", "data_axes", ("data", "data"), r"data_axes must name each mesh axis once", ValueError),
        (
            "CausalLMDataset source",
            "source",
            "a/path",
            r"source must be a TokenCache.*TokenCache.open",
            TypeError,
        ),
        ("structural ids", "pad_id", 65, r"pad_id=65 is inside the vocabulary \[0, 257\)", ValueError),
        ("structural ids", "doc_id", 97, r"doc_id=97 is inside the vocabulary", ValueError),
        ("structural ids", "doc_id", -1, r"doc_id must be >= 0", ValueError),
        ("structural ids", "doc_id", 258, r"doc_id and eod_id must differ", ValueError),
        ("structural ids", "pad_id", 257, r"doc_id and pad_id must differ", ValueError),
        ("MLMMasking", "mask_id", 257, r"mask_id=257 is one of special_ids", ValueError),
        ("MLMMasking", "mask_id", 259, r"mask_id=259 is one of special_ids", ValueError),
        ("MLMMasking", "mask_id", -1, r"mask_id must be >= 0", ValueError),
        ("MLMMasking", "mask_id", 65, r"mask_id=65 is an ordinary token", ValueError),
        ("MLMMasking", "mask_in_vocab", "yes", r"mask_in_vocab must be a bool", TypeError),
        ("TokenCache.open", "verify", "no", r"verify must be a bool", TypeError),
    ],
)
def test_hostile_ids_and_names(calls, name, param, value, match, error):
    path = calls["TokenCache.open"].kwargs["path"]
    hostile = {
        "Pipeline": calls["Pipeline"],
        "TokenCache.open": Call(TokenCache.open, path=path, verify=True),
        "CausalLMDataset source": Call(
            lambda source: CausalLMDataset(source, 16), source=TokenCache.open(path)
        ),
        "MLMMasking": Call(
            MLMMasking, key=0, mask_id=260, vocab_size=257, special_ids=(257, 258, 259), mask_in_vocab=False
        ),
        "structural ids": Call(
            lambda **ids: validate_array(np.full((1, 8), 259, np.int32), **ids),
            doc_id=257,
            eod_id=258,
            pad_id=259,
            vocab_size=257,
        ),
    }
    call = hostile[name]
    with pytest.raises(error, match=match):
        call.fn(**dict(call.kwargs, **{param: value}))


def test_no_work_proportional_to_a_stride_or_exponent():
    """A stride of 10^9 costs what a stride of 1 does (no loop over it; a hang guard, not a timing)."""
    built = []
    worker = threading.Thread(
        target=lambda: built.append(
            meshbatch.splice_schedule(
                [40, 2000],
                seq_len=64,
                content_length=8,
                content_start_mode="slide_within",
                content_stride=10**9,
            )
        ),
        daemon=True,
    )
    worker.start()
    worker.join(300)
    assert built and len(built[0]) == 57 + 57  # one start per document: 57 placements each
    with pytest.raises(ValueError, match=r"alpha=60\.0 makes the edge weights"):
        meshbatch.splice_schedule([5000], seq_len=4096, content_start_mode="coverage_balanced", alpha=60.0)
    with pytest.raises(ValueError, match=r"balance_tau=400\.0 overflows"):
        meshbatch.splice_schedule([5000, 60], seq_len=32, balance_mode="by_temperature", balance_tau=400.0)
    steep = meshbatch.splice_schedule([5000], seq_len=64, content_start_mode="coverage_balanced", alpha=12.0)
    starts = np.asarray(steep.lookup(np.arange(len(steep)))[1])
    assert starts.min() == 0 and starts.max() == 5000 - 64  # both edges, not all rows on one


HOSTILE_NAMES = [
    "..",
    "../../x",
    ".",
    "a/../b",
    "a//b",
    "/etc",
    "x\\..\\y",
    "a\0b",
    "",
    None,
    3,
    b"ab",
    ["a"],
]


def _name_calls(root: str, text: str):
    from meshbatch.cache import ShardedCacheWriter, build_cache

    def write_shard(name):
        ShardedCacheWriter(f"{root}/sharded", if_exists="overwrite").write_shard(name, [np.arange(3)])

    return [
        ("field", lambda v: CacheWriter(f"{root}/c", field=v)),
        ("field", lambda v: ShardedCacheWriter(f"{root}/s", field=v)),
        ("field", lambda v: build_cache(f"{root}/b", [text], field=v, progress=False)),
        ("name", write_shard),
    ]


@pytest.mark.parametrize("value", HOSTILE_NAMES, ids=repr)
def test_hostile_names_are_refused_by_name(tmp_path, value):
    """A field or shard name from a caller never leaves its directory: refused, naming the parameter."""
    (tmp_path / "in.txt").write_text("text")
    for param, call in _name_calls(str(tmp_path / "root"), str(tmp_path / "in.txt")):
        with pytest.raises((TypeError, ValueError)) as info:
            call(value)
        assert param in str(info.value), (param, value, info.value)
    outside = {p.name for p in tmp_path.iterdir()}
    assert outside <= {"in.txt", "root"}, outside
