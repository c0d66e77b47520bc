"""One read plan for many caches (``cache/many.py: prepare_reads``): the same buffer, span places,
counters and errors as one ``prepare_read`` per cache, in cache order; and fetch's batches are the
same with it and with a plan per source (``MESHBATCH_FETCH_PLAN``)."""

import functools
import shutil

import jax
import numpy as np
import pytest
import tensorstore as ts

from meshbatch import CausalLMDataset, Mixture, Pipeline, ShuffleSpec
from meshbatch.cache import (
    BlockCache,
    CacheChangedError,
    CacheIntegrityError,
    CacheWriter,
    ShardedCacheWriter,
    TokenCache,
    run_reads,
)
from meshbatch.cache.read.many import ReadSpace, prepare_reads
from meshbatch.pipeline.fetch import PLAN_ENV, one_plan

AT = 3  # where the reads begin in the buffer: tokens before it must stay untouched


def _docs(rng, n, dtype, high=60_000):
    return [rng.integers(0, high, size=int(rng.integers(1, 90)), dtype=dtype) for _ in range(n)]


def _write(path, docs, dtype="int32"):
    with CacheWriter(path, dtype=dtype) as writer:
        writer.write(docs)


def _write_sharded(path, parts, dtype="int32"):
    writer = ShardedCacheWriter(path, dtype=dtype)
    for k, docs in enumerate(parts):
        writer.write_shard(f"p{k}", iter(docs))
    writer.finish()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Caches of every kind: ``{name: (path, flat tokens)}``."""
    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(7)
    made = {}
    for name, dtype in (("c0", np.int32), ("c1", np.int32), ("c2", np.int32), ("u0", np.uint16)):
        docs = _docs(rng, int(rng.integers(5, 30)), dtype)
        _write(str(root / name), docs, np.dtype(dtype).name)
        made[name] = (str(root / name), np.concatenate(docs))
    for name, dtype in (("s0", np.int32), ("s1", np.int32), ("su", np.uint16)):
        parts = [_docs(rng, 6, dtype), _docs(rng, 1, dtype), _docs(rng, 9, dtype)]
        _write_sharded(str(root / name), parts, np.dtype(dtype).name)
        made[name] = (str(root / name), np.concatenate([d for part in parts for d in part]))
    docs = _docs(rng, 8, np.uint32, high=1000)  # uint32 does not widen into int32: read aside, checked
    _write(str(root / "w0"), docs, "uint32")
    made["w0"] = (str(root / "w0"), np.concatenate(docs))
    return made


# the caches a plan reads: (name, eager, block cache: None, "shared" or "own"); "c0" twice (another
# reader at the same path), and list entries that repeat a reader (the same cache as two sources)
LAYOUTS = {
    "plain": [("c0", True, None), ("c1", True, None), ("s0", True, None), ("u0", True, None)],
    "mixed": [
        ("c0", True, None),
        ("s0", False, None),
        ("u0", True, None),
        ("c1", True, "shared"),
        ("s1", False, "shared"),
        ("c2", True, "own"),
        ("su", False, "shared"),  # uint16 under the shared block cache: a plan of its own
        ("w0", True, None),  # uint32: read aside and narrowed, planned on its own
        ("c0", True, None),  # a second reader at c0's path: planned on its own
    ],
}

# plain: one plan, and one each for the two readers listed again; mixed: no block cache (c0, s0,
# u0), shared int32 (c1, s1), own (c2), shared uint16 (su), and w0, c0 again and the two again alone
PLANS = {"plain": 3, "mixed": 8}


def _open(corpus, layout):
    """The layout's readers, opened fresh (so two openings have the same history from here)."""
    shared = BlockCache(max_bytes=1 << 20, block_tokens=64)
    caches = []
    for name, eager, blocks in LAYOUTS[layout]:
        block_cache = {None: None, "shared": shared, "own": BlockCache(max_bytes=1 << 16, block_tokens=32)}
        caches.append(TokenCache.open(corpus[name][0], eager=eager, block_cache=block_cache[blocks]))
    return caches + caches[:2]  # the first two again: a reader listed twice


def _spans(rng, caches, n):
    """Random spans, duplicates, and spans at each cache's ends (adjacent across cache boundaries)."""
    source = rng.integers(0, len(caches), size=n)
    sizes = np.array([c.num_tokens for c in caches])
    lengths = rng.integers(0, 70, size=n)
    lengths = np.minimum(lengths, sizes[source])
    starts = rng.integers(0, sizes[source] - lengths + 1)
    edge = rng.random(n) < 0.3  # a span that ends a cache, or starts it
    ends_it = rng.random(n) < 0.5
    starts[edge & ends_it] = (sizes[source] - lengths)[edge & ends_it]
    starts[edge & ~ends_it] = 0
    repeat = rng.random(n) < 0.2
    index = np.flatnonzero(repeat)
    if index.size:
        pick = rng.integers(0, n, size=index.size)
        source[index], starts[index], lengths[index] = source[pick], starts[pick], lengths[pick]
    return source, starts, lengths


def _per_cache(caches, source, starts, lengths, out, at):
    """The reference: one ``prepare_read`` per cache, in cache order, each after the previous."""
    where = np.zeros(source.shape[0], np.int64)
    reads = []
    for c in np.unique(source).tolist():
        mine = np.flatnonzero(source == c)
        read = caches[c].prepare_read(starts[mine], lengths[mine], out, at)
        where[mine] = read.span_starts
        at = read.end
        reads.append(read)
    return reads, where, at


def _buffer(source, lengths):
    return np.full(AT + int(lengths.sum()) + 7, -1, np.int32)


@pytest.mark.parametrize("kept", [False, True], ids=["space-per-step", "space-kept"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_plan_equals_a_plan_per_cache(corpus, layout, kept):
    """One plan, step after step: a ``ReadSpace`` made for each step (``prepare_reads``) or kept
    across steps (as fetch keeps one per dataset: lazily opened parts open as steps touch them)."""
    mine, theirs = _open(corpus, layout), _open(corpus, layout)
    space = ReadSpace(mine)
    plan = space.prepare if kept else functools.partial(prepare_reads, mine)
    flats = {r: corpus[name][1] for r, (name, _, _) in enumerate(LAYOUTS[layout])}
    flats |= {len(LAYOUTS[layout]) + k: flats[k] for k in range(2)}
    rng = np.random.default_rng(len(layout))
    for step, n in enumerate((1, 5, 40, 300, 40, 300)):  # the second rounds: blocks and chunks cached
        source, starts, lengths = _spans(rng, mine, n)
        want = _buffer(source, lengths)
        reads, want_where, want_end = _per_cache(theirs, source, starts, lengths, want, AT)
        run_reads(reads)
        got = want.copy()
        got[:] = -1
        many = plan(source, starts, lengths, got, AT)
        run_reads(many.reads)
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
        np.testing.assert_array_equal(many.span_starts, want_where)
        assert many.end == want_end
        for i in range(n):  # and each span is its cache's tokens
            s, k = int(starts[i]), int(lengths[i])
            span = got[many.span_starts[i] : many.span_starts[i] + k]
            np.testing.assert_array_equal(span, flats[int(source[i])][s : s + k].astype(np.int32))
        if np.unique(source).size == len(mine):  # caches planned together: as many plans as expected
            assert len(many.reads) == PLANS[layout]
        for r, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert a.counters.as_dict() == b.counters.as_dict(), f"cache {r} at step {step}"
    assert sum(c.counters.as_dict()["reads_issued"] for c in mine) > 0


def test_runs_never_join_two_caches(corpus):
    a, b = (TokenCache.open(corpus[name][0]) for name in ("c0", "c1"))
    end = a.num_tokens
    out = np.zeros(20, np.int32)
    many = prepare_reads([a, b], [0, 1], [end - 4, 0], [4, 4], out, 0)  # adjacent in the virtual space
    run_reads(many.reads)
    np.testing.assert_array_equal(out[:8], np.r_[corpus["c0"][1][-4:], corpus["c1"][1][:4]])
    assert a.counters.as_dict()["runs"] == 1 and b.counters.as_dict()["runs"] == 1
    assert many.span_starts.tolist() == [0, 4] and many.end == 8


def test_empty_spans_and_untouched_caches(corpus):
    caches = [TokenCache.open(corpus[name][0]) for name in ("c0", "c1", "c2")]
    source, starts, lengths = np.array([2, 0, 2, 0]), np.array([5, 0, 9, 3]), np.array([0, 6, 4, 0])
    want = np.full(16, -1, np.int32)
    reads, where, end = _per_cache(caches, source, starts, lengths, want, 2)
    run_reads(reads)
    got = np.full(16, -1, np.int32)
    many = prepare_reads(
        [TokenCache.open(corpus[n][0]) for n in ("c0", "c1", "c2")], source, starts, lengths, got, 2
    )
    run_reads(many.reads)
    np.testing.assert_array_equal(got, want)
    assert many.span_starts.tolist() == where.tolist() == [8, 2, 8, 2] and many.end == end == 12
    none = prepare_reads(caches, np.zeros(0, np.int64), np.zeros(0, np.int64), 0, got, 5)  # no spans
    assert none.reads == [] and none.span_starts.size == 0 and none.end == 5


def _error(call):
    try:
        call()
    except Exception as e:  # the reference's error, to compare with
        return e
    raise AssertionError("no error")


@pytest.mark.parametrize(
    "case",
    ["past the end", "negative start", "out too small", "bad source"],
)
def test_errors_are_the_caches_own(corpus, case):
    names = ("c0", "s0", "u0", "c1")
    caches = [TokenCache.open(corpus[n][0]) for n in names]
    source, starts, lengths = (
        np.array([3, 1, 0, 1, 2]),
        np.array([0, 10, 4, 20, 1]),
        np.array([5, 5, 5, 5, 5]),
    )
    out = np.zeros(40, np.int32)
    if case == "past the end":
        starts[3] = caches[1].num_tokens - 2  # the second span of s0 (its place among s0's spans: 1)
    elif case == "negative start":
        starts[4] = -3
    elif case == "out too small":
        out = np.zeros(AT + 17, np.int32)
    else:
        with pytest.raises(IndexError, match="source 4 out of range for 4 caches"):
            prepare_reads(caches, np.array([4, 0, 0, 0, 0]), starts, lengths, out, AT)
        return
    want = _error(lambda: _per_cache(caches, source, starts, lengths, out, AT))
    with pytest.raises(type(want)) as got:
        prepare_reads(caches, source, starts, lengths, out, AT)
    assert str(got.value) == str(want)
    if case == "past the end":
        assert corpus["s0"][0] in str(want) and "span 1 " in str(want)


def copies(corpus, tmp_path, names) -> list[str]:
    """Copies of the corpus's caches ``names`` under ``tmp_path`` (a test may damage or replace them)."""
    paths = [str(tmp_path / name) for name in names]
    for name, path in zip(names, paths, strict=True):
        shutil.copytree(corpus[name][0], path)
    return paths


def test_a_replaced_cache_is_named(corpus, tmp_path):
    paths = copies(corpus, tmp_path, ("c0", "c1", "s0"))
    caches = [TokenCache.open(path) for path in paths]
    with CacheWriter(paths[1], if_exists="overwrite") as writer:  # a new cache at c1's path
        writer.write([np.arange(500, dtype=np.int32)])
    many = prepare_reads(caches, [0, 1, 2], [0, 0, 0], [4, 4, 4], np.zeros(12, np.int32), 0)
    with pytest.raises(
        CacheChangedError, match=f"cache {paths[1]} changed under an open reader: it was replaced"
    ):
        run_reads(many.reads)


def test_a_kept_space_sees_a_cache_replaced_after_its_first_step(corpus, tmp_path):
    paths = copies(corpus, tmp_path, ("c0", "c1", "s0"))
    space = ReadSpace([TokenCache.open(path, eager=path != paths[2]) for path in paths])
    out = np.zeros(12, np.int32)
    run_reads(space.prepare([0, 1, 2], [0, 0, 0], [4, 4, 4], out, 0).reads)
    with CacheWriter(paths[1], if_exists="overwrite") as writer:
        writer.write([np.arange(500, dtype=np.int32)])
    many = space.prepare([0, 1, 2], [0, 0, 0], [4, 4, 4], out, 0)
    with pytest.raises(CacheChangedError, match=f"cache {paths[1]} changed under an open reader"):
        run_reads(many.reads)


def test_a_kept_space_reads_the_rows_a_growing_cache_loads(tmp_path):
    """A cache still being written: what the space keeps is rebuilt when the reader loads more rows
    (its token count and, in the sharded layout, its new shards), and spans past what it had
    loaded are refused until then, naming the cache."""
    rng = np.random.default_rng(11)
    plain, sharded = str(tmp_path / "plain"), str(tmp_path / "sharded")
    _write(plain, _docs(rng, 12, np.int32))
    first = _docs(rng, 5, np.int32)
    writer = ShardedCacheWriter(sharded)
    writer.write_shard("p0", iter(first))
    caches = [TokenCache.open(plain), TokenCache.open(sharded, require_finished=False)]
    space = ReadSpace(caches)
    flat = np.concatenate(first)
    out = np.full(2048, -1, np.int32)
    run_reads(space.prepare([0, 1], [0, 0], [4, flat.size], out, 0).reads)
    np.testing.assert_array_equal(out[4 : 4 + flat.size], flat)
    with pytest.raises(IndexError, match=f"> num_tokens={flat.size} of cache {sharded}"):
        space.prepare([1], [0], [flat.size + 1], out, 0)
    more = _docs(rng, 4, np.int32)
    writer.write_shard("p1", iter(more))
    writer.finish()
    caches[1].refresh()
    flat = np.concatenate(first + more)
    n = min(flat.size, 60)
    out[:] = -1
    many = space.prepare([1, 0], [flat.size - n, 2], [n, 2], out, 0)
    run_reads(many.reads)
    assert many.span_starts.tolist() == [2, 0]
    np.testing.assert_array_equal(out[2 : 2 + n], flat[-n:])
    assert caches[1].counters.as_dict()["runs"] == 2


def test_a_damaged_chunk_is_named_as_before(corpus, tmp_path):
    paths = copies(corpus, tmp_path, ("c0", "c2", "s1"))
    shard = f"{paths[2]}/p2/input_ids/data"
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": shard}}
    ts.open(spec, open=True).result()[3].write(7).result()  # decodes, fails its checksum

    first = int(TokenCache.open(corpus["s1"][0]).row_spans([7])[0][0])  # row 7 begins shard p2

    def attempt(plan):  # p2 is one chunk, checked when a lazy reader first opens it: as it plans
        caches = [TokenCache.open(path, eager=False) for path in paths]
        source, starts, lengths = np.array([0, 2, 1]), np.array([0, first - 3, 2]), np.array([4, 9, 4])
        out = np.zeros(40, np.int32)
        return _error(lambda: run_reads(plan(caches, source, starts, lengths, out)))

    want = attempt(lambda *args: _per_cache(*args, 0)[0])
    got = attempt(lambda *args: prepare_reads(*args, 0).reads)
    assert type(got) is type(want) is CacheIntegrityError
    assert str(got) == str(want)
    assert f"{shard}: chunk 0" in str(got)


def test_a_damaged_chunk_found_on_read_is_named_as_before(corpus, tmp_path):
    """A cache of three chunks: open checks the last, the read checks chunk 0 (in the shared plan)."""
    big = str(tmp_path / "big")
    rng = np.random.default_rng(3)
    _write(big, [rng.integers(0, 50_000, size=1000, dtype=np.int32) for _ in range(600)])
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{big}/input_ids/data"}}
    ts.open(spec, open=True).result()[10].write(7).result()
    paths = [corpus["c0"][0], big, corpus["c1"][0]]

    def attempt(plan):
        caches = [TokenCache.open(path) for path in paths]
        source, starts, lengths = (
            np.array([1, 0, 2, 1]),
            np.array([5000, 0, 2, 300_000]),
            np.array([8, 4, 4, 8]),
        )
        return _error(lambda: run_reads(plan(caches, source, starts, lengths, np.zeros(40, np.int32))))

    want = attempt(lambda *args: _per_cache(*args, 0)[0])
    got = attempt(lambda *args: prepare_reads(*args, 0).reads)
    assert type(got) is type(want) is CacheIntegrityError
    assert str(got) == str(want)
    assert f"{big}/input_ids/data: chunk 0 (elements [0, 262144))" in str(got)


def test_the_plan_switch_is_honoured_or_refused(monkeypatch):
    assert one_plan()
    monkeypatch.setenv(PLAN_ENV, "per-source")
    assert not one_plan()
    monkeypatch.setenv(PLAN_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"MESHBATCH_FETCH_PLAN must be 'one' or 'per-source'.*'sometimes'"):
        one_plan()


@pytest.mark.parametrize("devices", [1, 8])
def test_pipeline_batches_are_the_same_with_a_plan_per_source(corpus, monkeypatch, devices):
    """A mixture of block-shuffled children over consolidated, sharded (lazy) and uint16 caches,
    on one device and on 8 (each group's spans copied from one scratch read)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    names = ("c0", "c1", "s0", "u0", "su", "s1")

    def batches(plan):
        monkeypatch.setenv(PLAN_ENV, plan)
        kids = {
            name: CausalLMDataset(
                TokenCache.open(corpus[name][0], eager=name != "s1"), 16, shuffle=ShuffleSpec("block")
            )
            for name in names
        }
        dataset = Mixture(kids, dict.fromkeys(names, 1.0), block_size=64)
        pipeline = Pipeline(dataset, mesh=mesh, batch_size=16, key=3)
        return [np.asarray(pipeline.batch(step).tokens) for step in range(3)]

    for step, (got, want) in enumerate(zip(batches("one"), batches("per-source"), strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"{step=}")
