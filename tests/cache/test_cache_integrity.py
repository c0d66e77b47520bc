"""Damaged caches: every damage is a named failure, on read and in ``validate-cache`` (default, --deep).

One good cache (random tokens, 2.3 read chunks of data) is written once; each case damages a copy
and states what each layer reports. ``None`` means that layer passes: the default validation reads
metadata only, so damage inside a chunk that still decodes is found by ``--deep`` alone.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorstore as ts

from meshbatch.cache import (
    DEFAULT_CHUNK_SIZE,
    CacheChangedError,
    CacheIntegrityError,
    CacheWriter,
    TokenCache,
    validate_cache,
)
from meshbatch.cache.format.arrays import open_field
from meshbatch.cli import main

C = DEFAULT_CHUNK_SIZE


def _docs(seed: int, tokens: int) -> list[np.ndarray]:
    """Random rows (lengths 1000..2999, tokens < 50000) totalling exactly ``tokens``."""
    rng = np.random.default_rng(seed)
    flat = rng.integers(0, 50_000, size=tokens, dtype=np.int32)
    cuts = np.cumsum(rng.integers(1000, 3000, size=tokens // 1000))
    return np.split(flat, cuts[cuts < tokens])


DOCS = _docs(0, 2 * C + 75_000)  # read chunks 0 and 1 full, chunk 2 partial
TOKENS = sum(d.size for d in DOCS)
ROWS = len(DOCS)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("integrity")
    path = str(root / "good")
    with CacheWriter(path) as writer:
        writer.write(DOCS)
    older = str(root / "older")
    with CacheWriter(older) as writer:  # an older, smaller cache: same chunk count, other tokens
        writer.write(_docs(1, 2 * C + 50_000))
    return path


def _file(path, *parts) -> str:
    return os.path.join(path, "input_ids", *parts)


def _flip(name, at):
    def damage(path, older=None):
        with open(_file(path, *name), "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(at(size))
            byte = f.read(1)[0]
            f.seek(at(size))
            f.write(bytes([byte ^ 0x5A]))

    return damage


def _truncate(to):
    def damage(path, older=None):
        shard = _file(path, "data", "c", "0")
        os.truncate(shard, to(os.path.getsize(shard)))

    return damage


def _edit_json(file, **changes):
    def damage(path, older=None):
        target = os.path.join(path, file)
        with open(target) as f:
            value = json.load(f)
        value.update(changes)
        with open(target, "w") as f:
            json.dump(value, f)

    return damage


def _array(path, name, **extra) -> ts.TensorStore:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": _file(path, name)}, **extra}
    return ts.open(spec, open=True).result()


def _drop_inner_chunk(k):
    def damage(
        path, older=None
    ):  # zeros equal the fill value, so TensorStore deletes the chunk instead of writing it
        _array(path, "data", store_data_equal_to_fill_value=False)[k * C : (k + 1) * C].write(0).result()

    return damage


def _nudge_offset(row, by, *, ledger=False):
    def damage(path, older=None):
        offsets = _array(path, "offsets")
        offsets[row + 1].write(int(offsets[row + 1].read().result()) + by).result()
        if ledger:  # keep the ledger's token count consistent, as a careless repair would
            _edit_json("shard_ledger.json", field_counts={"input_ids": TOKENS + by})(path)

    return damage


def _copy_older_data_shard(path, older):
    shutil.copy(_file(older, "data", "c", "0"), _file(path, "data", "c", "0"))


DEEP_CHECKSUM = "fails its checksum: the writer recorded crc32"
UNREADABLE_END = "but the data chunk holding token .* cannot be read"

# (damage, error on open or on reading every token, default validation, --deep validation)
CASES = {
    "data shard deleted": (
        lambda p, _: os.unlink(_file(p, "data", "c", "0")),
        UNREADABLE_END + ".*NOT_FOUND",
        UNREADABLE_END,
        UNREADABLE_END,
    ),
    "inner chunk missing": (
        _drop_inner_chunk(1),
        r"array .*/input_ids/data, tokens \[\d+, \d+\) \(global tokens .*read failed: NOT_FOUND.*missing",
        None,
        r"input_ids/data: chunk 1 \(elements \[262144, 524288\)\) cannot be read: NOT_FOUND",
    ),
    "data shard truncated to 0 bytes": (
        _truncate(lambda n: 0),
        UNREADABLE_END,
        UNREADABLE_END,
        UNREADABLE_END,
    ),
    "data shard truncated to half": (
        _truncate(lambda n: n // 2),
        UNREADABLE_END,
        UNREADABLE_END,
        UNREADABLE_END,
    ),
    "data shard 3 bytes short": (_truncate(lambda n: n - 3), UNREADABLE_END, UNREADABLE_END, UNREADABLE_END),
    "byte flipped in data": (  # the chunk still decodes: its first read verifies it
        _flip(("data", "c", "0"), lambda n: n // 3),
        r"cache .*: .*/input_ids/data: chunk \d \(elements .*" + DEEP_CHECKSUM + r".*\(global tokens \[",
        None,
        r"input_ids/data: chunk \d \(elements .*" + DEEP_CHECKSUM,
    ),
    "byte flipped in offsets": (  # offsets compress well: a flipped byte no longer decodes
        _flip(("offsets", "c", "0"), lambda n: n // 2),
        r"input_ids/offsets: cannot read offsets\[0\].*Blosc error",
        r"cannot read offsets\[0\].*Blosc error",
        r"cannot read offsets\[0\].*Blosc error",
    ),
    "offset nudged by 3 tokens": (  # the offsets are summed as they load
        _nudge_offset(10, 3),
        r"input_ids/offsets: chunk 0 .*" + DEEP_CHECKSUM,
        r"input_ids/offsets: chunk 0 .*" + DEEP_CHECKSUM,
        r"input_ids/offsets: chunk 0 .*" + DEEP_CHECKSUM,
    ),
    "last offset past the data, ledger edited to match": (
        _nudge_offset(ROWS - 1, 3, ledger=True),
        r"meshbatch_checksums.json records \d+ rows and \d+ tokens written, but .* say \d+ rows",
        "meshbatch_checksums.json records",
        "meshbatch_checksums.json records",
    ),
    "last offset a chunk past the data, ledger edited to match": (
        _nudge_offset(ROWS - 1, C, ledger=True),
        UNREADABLE_END + ".*NOT_FOUND",
        UNREADABLE_END,
        UNREADABLE_END,
    ),
    "data_type int32 -> uint32 in zarr.json": (
        _edit_json("input_ids/data/zarr.json", data_type="uint32"),
        "data has dtype uint32, but .*meshbatch_checksums.json records that its writer wrote int32",
        "records that its writer wrote int32",
        "records that its writer wrote int32",
    ),
    "data_type int32 -> int16 in zarr.json": (
        _edit_json("input_ids/data/zarr.json", data_type="int16"),
        UNREADABLE_END,
        UNREADABLE_END,
        UNREADABLE_END,
    ),
    "shape edited in zarr.json": (
        _edit_json("input_ids/data/zarr.json", shape=[1000]),
        r"input_ids/data has shape \[1000\]; Levanter writes \[18014398509481984\]",
        "has shape",
        "has shape",
    ),
    "data shard copied from an older smaller cache": (  # its last chunk is read whole at open
        _copy_older_data_shard,
        r"input_ids/data: chunk 2 \(elements \[524288, 599288\)\) " + DEEP_CHECKSUM,
        r"input_ids/data: chunk 2 .*" + DEEP_CHECKSUM,
        r"input_ids/data: chunk 2 .*" + DEEP_CHECKSUM,
    ),
    "total_num_rows = 10**12": (
        _edit_json("shard_ledger.json", total_num_rows=10**12),
        r"offsets\[0\] = \d+ rows on disk, but the ledger commits 1000000000000 rows",
        "ledger commits 1000000000000 rows",
        "ledger commits 1000000000000 rows",
    ),
    "total_num_rows and offsets[0] = 10**12": (
        lambda p, _: (
            _edit_json("shard_ledger.json", total_num_rows=10**12)(p),
            _array(p, "offsets")[0].write(10**12).result(),
        ),
        r"cannot read offsets\[1000000000000\], the end of the last row .*NOT_FOUND",
        r"cannot read offsets\[1000000000000\]",
        r"cannot read offsets\[1000000000000\]",
    ),
}


def _outcome(run) -> str | None:
    try:
        run()
    except CacheIntegrityError as e:
        return str(e)
    return None


def _read_everything(path: str) -> None:
    cache = TokenCache.open(path)
    got = cache.read_spans([0], [cache.num_tokens])
    # what is served is what was written, or an error was raised above
    if cache.num_tokens == TOKENS and np.array_equal(got.tokens, np.concatenate(DOCS)):
        return
    raise AssertionError("damaged tokens were served without an error")


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_cache_is_a_named_failure(good, tmp_path, case, capsys):
    damage, on_read, default, deep = CASES[case]
    path = str(tmp_path / "damaged")
    shutil.copytree(good, path)
    damage(path, os.path.join(os.path.dirname(good), "older"))

    try:
        got = _outcome(lambda: _read_everything(path))
    except AssertionError:
        assert on_read is None, "a damage the reader should refuse was served"
        got = "served (documented: only --deep finds damage inside a chunk that decodes)"
    if on_read is not None:
        assert got is not None and re.search(on_read, got), got

    for flag, expected in (([], default), (["--deep", "--no-progress"], deep)):
        report = validate_cache(path, deep=bool(flag), progress=False)
        assert report.ok == (expected is None), (flag, report.format())
        if expected is not None:
            assert re.search(expected, report.error), report.error
        assert main(["validate-cache", path, *flag]) == (expected is not None)
        out, err = capsys.readouterr()
        assert ("INVALID" in out) == (expected is not None) and "Traceback" not in out + err


@pytest.mark.parametrize(
    "key, value",
    [
        (key, value)
        for key in ("total_num_rows", "shard_rows", "is_finished", "finished_shards", "field_counts")
        for value in (None, "7", [1])
    ]
    + [
        ("total_num_rows", 6.0),
        ("total_num_rows", -1),
        ("is_finished", 1),
        ("field_counts", {"input_ids": None}),
        ("meshbatch_checksums", 1),
        ("meshbatch_checksums", "yes"),
    ],
)
def test_ledger_values_of_the_wrong_json_type_are_named(good, tmp_path, key, value, capsys):
    path = str(tmp_path / "damaged")
    shutil.copytree(good, path)
    _edit_json("shard_ledger.json", **{key: value})(path)
    with pytest.raises(CacheIntegrityError, match=rf"ledger {path}/shard_ledger.json: {key}.* must be"):
        TokenCache.open(path)
    assert main(["validate-cache", path]) == 1
    out, err = capsys.readouterr()
    assert f"CacheIntegrityError: ledger {path}/shard_ledger.json: {key}" in out and "Traceback" not in err


@pytest.mark.parametrize(
    "text, message", [("{not json", "is not valid JSON"), ("[1, 2]", "holds a JSON list")]
)
def test_ledger_that_is_not_a_json_object_is_named(good, tmp_path, text, message):
    path = str(tmp_path / "damaged")
    shutil.copytree(good, path)
    with open(os.path.join(path, "shard_ledger.json"), "w") as f:
        f.write(text)
    assert message in validate_cache(path).error


def test_chunk_deleted_while_a_cache_is_open_fails_the_next_read(good, tmp_path):
    path = str(tmp_path / "copy")
    shutil.copytree(good, path)
    cache = TokenCache.open(path)
    np.testing.assert_array_equal(cache.read_rows([0])[0], DOCS[0])  # its chunk is in the cache pool now
    _drop_inner_chunk(0)(path)
    with pytest.raises(
        CacheIntegrityError, match=rf"cache {path}: array {path}/input_ids/data, tokens \[0, "
    ):
        cache.read_rows([0])
    os.unlink(_file(path, "data", "c", "0"))
    with pytest.raises(CacheIntegrityError, match="read failed: NOT_FOUND"):
        cache.read_spans([2 * C], [10])


def test_read_errors_reach_the_consumer_of_a_prefetcher(good, tmp_path):
    from meshbatch.cache import run_reads
    from meshbatch.pipeline.prefetch import Prefetcher

    path = str(tmp_path / "copy")
    shutil.copytree(good, path)
    cache = TokenCache.open(path)
    _drop_inner_chunk(1)(path)

    def produce(step: int) -> np.ndarray:
        out = np.zeros(1000, np.int32)
        run_reads([cache.prepare_read(np.array([step * C + 5]), np.array([1000]), out, 0)])
        return out

    with Prefetcher(produce, start=0, depth=2, workers=1) as stream:
        np.testing.assert_array_equal(next(stream), np.concatenate(DOCS)[5:1005])  # step 0: chunk 0
        with pytest.raises(CacheIntegrityError, match=r"tokens \[262149, 263149\).*NOT_FOUND"):
            next(stream)  # step 1 reads the missing chunk 1


def test_levanter_written_cache_validates_and_deep_finds_its_damage(tmp_path, capsys):
    from levanter.store.cache import SerialCacheWriter

    path = str(tmp_path / "levanter")
    with SerialCacheWriter(path, {"input_ids": np.zeros((0,), np.int32)}) as writer:
        writer.write_batch([{"input_ids": d} for d in DOCS])
    for deep in (False, True):
        report = validate_cache(path, deep=deep, progress=False)
        assert report.ok, report.error
        assert report.checksums.startswith("absent")
    assert main(["validate-cache", path, "--deep", "--no-progress"]) == 0
    assert "every chunk decoded: 4 chunks" in capsys.readouterr().out  # 1 offsets + 3 data chunks

    _drop_inner_chunk(1)(path)
    assert validate_cache(path).ok  # metadata only
    assert "chunk 1 (elements [262144, 524288)) cannot be read" in validate_cache(path, deep=True).error


def test_pipeline_steps_that_hit_damage_raise_in_the_consumer(good, tmp_path):
    import jax
    from jax.sharding import Mesh

    from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec

    path = str(tmp_path / "copy")
    shutil.copytree(good, path)
    seq_len, batch = 4096, 8  # no shuffle: step s reads tokens [s * 32768, (s + 1) * 32768)
    cache = TokenCache.open(path)
    pipeline = Pipeline(
        CausalLMDataset(cache, seq_len, shuffle=ShuffleSpec("none")),
        mesh=Mesh(np.array(jax.devices()[:2]), ("data",)),
        batch_size=batch,
        key=0,
    )
    _drop_inner_chunk(1)(path)  # tokens [262144, 524288): steps 8..15
    stream = pipeline.iterate_from(6)
    for step in (6, 7):
        expected = np.concatenate(DOCS)[step * batch * seq_len : (step + 1) * batch * seq_len]
        np.testing.assert_array_equal(np.asarray(next(stream).tokens).reshape(-1), expected)
    with pytest.raises(CacheIntegrityError, match=rf"cache {path}: array {path}/input_ids/data, tokens \["):
        next(stream)
    stream.close()

    writer = CacheWriter(path, if_exists="overwrite")
    writer.write(DOCS)  # the same rows, a new cache: still refused
    writer.finish()
    with pytest.raises(
        CacheChangedError, match=f"cache {path} changed under an open reader: it was replaced"
    ):
        pipeline.batch(0)


def test_deep_validation_of_a_sharded_cache_names_the_damaged_shard(tmp_path):
    from meshbatch.cache import ShardedCacheWriter

    root = str(tmp_path / "sharded")
    writer = ShardedCacheWriter(root)
    writer.write_shard("p0", iter(DOCS[:10]))
    writer.write_shard("p1", iter(DOCS[10:20]))
    writer.finish()
    report = validate_cache(root, deep=True, progress=False)
    assert report.ok and report.checksums == "present, 4 chunks verified"  # offsets + data, per shard
    _flip(("data", "c", "0"), lambda n: n // 2)(os.path.join(root, "p1"))
    error = validate_cache(root, deep=True, progress=False).error
    assert f"{root}/p1/input_ids/data: chunk 0 (elements [0, " in error and DEEP_CHECKSUM in error


def test_deep_validation_of_a_cache_being_written(tmp_path, monkeypatch):
    from meshbatch.cache.write import writer as writer_module

    path = str(tmp_path / "open")
    writer = CacheWriter(path)
    writer.write(DOCS[:5])
    writer.flush()
    report = validate_cache(path, require_finished=False, deep=True, progress=False)
    assert report.ok and report.checksums == "present, 2 chunks verified"
    # killed between the sidecar and the ledger: the sidecar is ahead of what the ledger commits
    monkeypatch.setattr(
        writer_module, "write_ledger", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    writer.write(DOCS[5:8])
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    report = validate_cache(path, require_finished=False, deep=True, progress=False)
    assert report.ok and report.checksums == "present, not verified: the writer is between commits"
    assert report.num_rows == 5


def _small(path: str) -> str:
    with CacheWriter(path) as writer:
        writer.write([np.arange(10, dtype=np.int32), np.arange(10, 20, dtype=np.int32)])
    return path


SIDECAR = os.path.join("input_ids", "meshbatch_checksums.json")


@pytest.mark.parametrize(
    "file, edit, message",
    [
        (
            "shard_ledger.json",
            lambda t: t.replace('"total_num_rows": 2', '"total_num_rows": ' + "1" * 5000),
            "is not valid JSON: .*4300 digits",
        ),
        ("shard_ledger.json", lambda t: "[" * 100_000 + "]" * 100_000, "is not valid JSON: .*recursion"),
        (
            SIDECAR,
            lambda t: t.replace('"rows": 2', '"rows": ' + "1" * 5000),
            "is not valid JSON: .*4300 digits",
        ),
        (SIDECAR, lambda t: "[" * 100_000 + "]" * 100_000, "is not valid JSON: .*recursion"),
        (
            SIDECAR,
            lambda t: t.replace('"dtype": "int32"', '"dtype": "(2**70,)i4"'),
            r"dtype='\(2\*\*70,\)i4' is not a numpy dtype",
        ),
        (
            SIDECAR,
            lambda t: t.replace(
                '"dtype": "int32"', '"dtype": {"names": ["a", "a"], "formats": ["i4", "i4"]}'
            ),
            r"dtype=\{'names': \['a', 'a'\].* is not a numpy dtype",
        ),
    ],
)
def test_json_that_python_or_numpy_refuse_is_a_named_integrity_error(tmp_path, file, edit, message):
    """Huge integers, deep nesting and a dtype numpy rejects with ValueError: named, never bare."""
    path = _small(str(tmp_path / "c"))
    target = os.path.join(path, file)
    with open(target) as f:
        text = f.read()
    assert edit(text) != text
    with open(target, "w") as f:
        f.write(edit(text))
    with pytest.raises(CacheIntegrityError, match=re.escape(target) + ".*" + message):
        TokenCache.open(path)
    error = validate_cache(path).error
    assert error.startswith("CacheIntegrityError: ") and target in error and re.search(message, error), error


def test_a_deleted_sidecar_of_a_meshbatch_cache_is_named_not_read_unverified(tmp_path):
    """The ledger says ``CacheWriter`` wrote the cache, which always writes a sidecar with it:
    without it a rewritten token was served and ``--deep`` called the cache Levanter's."""
    path = _small(str(tmp_path / "c"))
    open_field(path, "input_ids", writable=True).data[3:4].write(np.array([777], np.int32)).result()
    sidecar = os.path.join(path, SIDECAR)
    os.remove(sidecar)
    with open(os.path.join(path, "shard_ledger.json")) as f:
        assert json.load(f)["meshbatch_checksums"] is True
    message = f"{re.escape(sidecar)} is missing, but the ledger .* says meshbatch_checksums=true"
    for verify in (True, False):
        with pytest.raises(CacheIntegrityError, match=message):
            TokenCache.open(path, verify=verify)
    for deep in (False, True):
        report = validate_cache(path, deep=deep, progress=False)
        assert not report.ok and re.search(message, report.error), report.error


def test_a_deleted_sidecar_of_one_shard_is_named(tmp_path):
    from meshbatch.cache import ShardedCacheWriter

    root = str(tmp_path / "s")
    writer = ShardedCacheWriter(root)
    writer.write_shard("p0", [np.arange(10, dtype=np.int32)])
    writer.write_shard("p1", [np.arange(10, 20, dtype=np.int32)])
    writer.finish()
    sidecar = os.path.join(root, "p1", SIDECAR)
    os.remove(sidecar)
    with pytest.raises(CacheIntegrityError, match=f"{re.escape(sidecar)} is missing, but the ledger "):
        TokenCache.open(root)
    report = validate_cache(root, deep=True, progress=False)
    assert not report.ok and f"{sidecar} is missing" in report.error  # was "present for 1 of 2 shards"


@pytest.mark.parametrize("keys", [("meshbatch_checksums",), ("meshbatch_checksums", "cache_id")])
def test_a_cache_whose_ledger_does_not_promise_a_sidecar_reads_without_one(tmp_path, keys):
    """What Levanter writes (neither key), a quick start's build and older meshbatch caches (a
    cache_id only) have no sidecar to require: they stay readable, checksums absent."""
    path = _small(str(tmp_path / "c"))
    os.remove(os.path.join(path, SIDECAR))
    ledger = os.path.join(path, "shard_ledger.json")
    with open(ledger) as f:
        raw = json.load(f)
    for key in keys:
        del raw[key]
    with open(ledger, "w") as f:
        json.dump(raw, f)
    assert [r.tolist() for r in TokenCache.open(path).read_rows([1])] == [list(range(10, 20))]
    report = validate_cache(path, deep=True, progress=False)
    assert report.ok and report.checksums.startswith("absent"), report.format()
