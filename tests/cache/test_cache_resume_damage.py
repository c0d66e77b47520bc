"""A resume never blesses damage: what it re-sums from disk is first checked against the sidecar.

A killed build is resumed from its committed rows; the chunks a resume sums again from disk (the
partial last data chunk, offsets chunk 0, the partial last offsets chunk) are compared with the
CRC-32s the sidecar already records, so damage done before the resume is refused by name instead
of getting a fresh checksum. A damaged or missing sidecar, a deleted shard, or a sharded resume with
another dtype or field is refused before anything is written.
"""

import json
import os

import numpy as np
import pytest

from meshbatch.cache import (
    CacheIntegrityError,
    CacheWriter,
    ShardedCacheWriter,
    TokenCache,
    validate_cache,
)
from meshbatch.cache.format.arrays import DEFAULT_CHUNK_SIZE, open_field
from meshbatch.cache.write import writer as writer_module

C = DEFAULT_CHUNK_SIZE


def _killed(path: str, rows, **kwargs) -> CacheWriter:
    """A writer that committed ``rows`` and was then dropped unfinished (as a SIGKILL leaves it)."""
    writer = CacheWriter(path, **kwargs)
    writer.write(rows)
    writer.flush()
    return writer


def _rows() -> list[np.ndarray]:
    return [np.arange(10, dtype=np.int32), np.arange(10, 20, dtype=np.int32)]


def _sidecar(path: str) -> str:
    return os.path.join(path, "input_ids", "meshbatch_checksums.json")


def _killed_before_ledger(writer: CacheWriter, extra, monkeypatch) -> None:
    """A flush of ``extra`` rows killed after its sidecar, before its ledger."""
    monkeypatch.setattr(
        writer_module, "write_ledger", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    writer._pending, writer._pending_tokens = list(extra), sum(len(r) for r in extra)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    monkeypatch.undo()


def test_resume_refuses_a_token_damaged_in_the_partial_last_chunk(tmp_path):
    path = str(tmp_path / "c")
    _killed(path, _rows())
    open_field(path, "input_ids", writable=True).data[3:4].write(np.array([777], np.int32)).result()
    with pytest.raises(
        CacheIntegrityError,
        match=r"cannot resume .*/c: .*/c/input_ids/data: chunk 0 \(elements \[0, 20\)\) fails its checksum",
    ):
        CacheWriter(path, if_exists="resume")
    with pytest.raises(CacheIntegrityError, match="fails its checksum"):  # not laundered: still named
        TokenCache.open(path, require_finished=False).read_rows([0])


def test_resume_refuses_an_offset_nudged_in_chunk_0_and_a_reader_names_it(tmp_path):
    """Offsets chunk 0 with offsets[0] ahead of the sidecar (killed after step 2 of a commit)."""
    path = str(tmp_path / "c")
    _killed(path, _rows())
    offsets = open_field(path, "input_ids", writable=True).offsets
    offsets[1:2].write(np.array([7], np.int64)).result()  # row 0 now [0, 7), row 1 [7, 20)
    offsets[0:1].write(np.array([3], np.int64)).result()
    with pytest.raises(CacheIntegrityError, match=r"input_ids/offsets: chunk 0 \(elements \[0, 3\)\) fails"):
        TokenCache.open(path, require_finished=False)
    with pytest.raises(
        CacheIntegrityError,
        match=r"cannot resume .*/c/input_ids/offsets: chunk 0 \(elements \[0, 3\)\) fails",
    ):
        CacheWriter(path, if_exists="resume")
    assert int(offsets[0].read().result()) == 3  # refused before writing anything


def test_resume_refuses_damage_in_the_partial_last_chunks_past_chunk_0(tmp_path):
    """Data and offsets tails in chunk 1 (the full chunk 0 keeps its recorded sum)."""
    path = str(tmp_path / "c")
    rows = [np.full(1, i % 1000, np.int32) for i in range(C + 5)]  # offsets tail in chunk 1
    _killed(path, rows)
    writer = CacheWriter(path, if_exists="resume")  # undamaged: resumes
    writer.write([np.arange(C - 10, dtype=np.int32)])  # data tail in chunk 1 too: [C, 2C - 5)
    writer.flush()
    arrays = open_field(path, "input_ids", writable=True)
    token = arrays.data[C + 2 : C + 3].read().result()
    arrays.data[C + 2 : C + 3].write(token + 1).result()
    with pytest.raises(
        CacheIntegrityError, match=rf"input_ids/data: chunk 1 \(elements \[{C}, {2 * C - 5}\)\)"
    ):
        CacheWriter(path, if_exists="resume")
    arrays.data[C + 2 : C + 3].write(token).result()  # undone
    arrays.offsets[C + 1 : C + 2].write(np.array([C + 2], np.int64)).result()  # was C + 1: still monotone
    with pytest.raises(
        CacheIntegrityError, match=rf"input_ids/offsets: chunk 1 \(elements \[{C}, {C + 7}\)\)"
    ):
        CacheWriter(path, if_exists="resume")


@pytest.mark.parametrize(
    "damage, message",
    [
        ("not json", r"cannot resume .*: .*meshbatch_checksums.json is not valid JSON"),
        ("missing", r"cannot resume .*: .*meshbatch_checksums.json is missing, but the ledger has cache_id"),
        (
            "dtype",
            r"cannot resume .*: .*/data has dtype int32, but .*meshbatch_checksums.json records .* uint32",
        ),
        ("chunk", r"cannot resume .*: .*meshbatch_checksums.json has chunk_elements=4; .* writes 262144"),
        ("behind", r"cannot resume .*: .*meshbatch_checksums.json records 1 rows and 10 tokens written, but"),
    ],
)
def test_resume_refuses_a_damaged_sidecar(tmp_path, damage, message):
    path = str(tmp_path / "c")
    _killed(path, _rows())
    with open(_sidecar(path)) as f:
        raw = json.load(f)
    if damage == "missing":
        os.remove(_sidecar(path))
    else:
        if damage == "not json":
            text = "{"
        else:
            raw.update(
                {
                    "dtype": {"dtype": "uint32"},
                    "chunk": {"chunk_elements": 4, "data": [0] * 5, "offsets": [0]},
                }.get(damage, {"rows": 1, "tokens": 10})
            )
            text = json.dumps(raw)
        with open(_sidecar(path), "w") as f:
            f.write(text)
    with pytest.raises(CacheIntegrityError, match=message):
        CacheWriter(path, if_exists="resume")


def test_a_cache_without_sidecar_or_cache_id_is_resumed_from_disk(tmp_path):
    """A Levanter-written cache has nothing to check against: its chunks are summed from disk."""
    path, clean = str(tmp_path / "c"), str(tmp_path / "clean")
    _killed(path, _rows())
    os.remove(_sidecar(path))
    with open(os.path.join(path, "shard_ledger.json")) as f:
        ledger = json.load(f)
    del ledger["cache_id"]
    with open(os.path.join(path, "shard_ledger.json"), "w") as f:
        json.dump(ledger, f)
    with CacheWriter(path, if_exists="resume") as writer:
        writer.write([np.arange(5, dtype=np.int32)])
    with CacheWriter(clean) as writer:
        writer.write([*_rows(), np.arange(5, dtype=np.int32)])
    for name in ("meshbatch_checksums.json",):
        with (
            open(os.path.join(path, "input_ids", name)) as f,
            open(os.path.join(clean, "input_ids", name)) as g,
        ):
            assert json.load(f) == json.load(g)
    assert validate_cache(path, deep=True, progress=False).ok


def test_a_sidecar_ahead_of_the_ledger_is_checked_and_resumed_again_and_again(tmp_path, monkeypatch):
    """Killed between sidecar and ledger; then a resume killed before it commits; then a clean finish."""
    path, clean = str(tmp_path / "c"), str(tmp_path / "clean")
    extra = [np.arange(30, 40, dtype=np.int32)]
    _killed_before_ledger(_killed(path, _rows()), extra, monkeypatch)
    with open(_sidecar(path)) as f:
        assert json.load(f)["rows"] == 3  # ahead of the ledger's 2
    CacheWriter(path, if_exists="resume")  # checks, truncates, then is killed before any commit
    resumed = CacheWriter(path, if_exists="resume")
    _killed_before_ledger(resumed, [np.arange(50, 55, dtype=np.int32)], monkeypatch)  # killed again
    with CacheWriter(path, if_exists="resume") as writer:
        assert writer.num_rows == 2
        writer.write([np.arange(60, 64, dtype=np.int32)])
    with CacheWriter(clean) as writer:
        writer.write([*_rows(), np.arange(60, 64, dtype=np.int32)])
    with open(_sidecar(path)) as f, open(_sidecar(clean)) as g:
        assert json.load(f) == json.load(g)
    assert validate_cache(path, deep=True, progress=False).ok


def test_a_sidecar_ahead_of_the_ledger_still_names_a_damaged_tail(tmp_path, monkeypatch):
    path = str(tmp_path / "c")
    _killed_before_ledger(_killed(path, _rows()), [np.arange(30, 40, dtype=np.int32)], monkeypatch)
    open_field(path, "input_ids", writable=True).data[12:13].write(np.array([777], np.int32)).result()
    with pytest.raises(CacheIntegrityError, match=r"input_ids/data: chunk 0 \(elements \[0, 30\)\) fails"):
        CacheWriter(path, if_exists="resume")


@pytest.mark.parametrize("victim, rows", [("offsets", _rows()), ("data", _rows()), ("data", [np.arange(C)])])
def test_resume_over_a_deleted_shard_is_named(tmp_path, victim, rows):
    """The last row ending mid-chunk, or at a chunk boundary (the last data chunk is then full)."""
    path = str(tmp_path / "c")
    _killed(path, rows)
    shard = os.path.join(path, "input_ids", victim, "c", "0")
    os.remove(shard)
    with pytest.raises(
        CacheIntegrityError, match=rf"cannot resume .*/c: .*/c/input_ids/{victim}.*cannot be read"
    ):
        CacheWriter(path, if_exists="resume")


def test_sharded_resume_refuses_another_dtype_or_field_up_front(tmp_path):
    root = str(tmp_path / "c")
    ShardedCacheWriter(root, dtype="int32").write_shard("part-0", [np.arange(5)])  # killed before part-1
    with pytest.raises(ValueError, match=r"cannot resume .*/c with dtype=uint16: shard 'part-0' holds int32"):
        ShardedCacheWriter(root, dtype="uint16", if_exists="resume")
    with pytest.raises(
        ValueError, match=r"cannot resume .*/c with field='text': it holds field\(s\) \['input_ids'\]"
    ):
        ShardedCacheWriter(root, field="text", if_exists="resume")
    assert not os.path.exists(os.path.join(root, "part-1"))
    resumed = ShardedCacheWriter(root, dtype="int32", if_exists="resume")
    resumed.write_shard("part-0", None)
    resumed.write_shard("part-1", [np.arange(3)])
    resumed.finish()
    assert TokenCache.open(root).num_rows == 2


def test_resuming_an_interrupted_shard_checks_dtype_and_field(tmp_path, monkeypatch):
    """No shard listed yet: the interrupted shard's own resume names the mismatch."""
    root = str(tmp_path / "c")
    writer = ShardedCacheWriter(root)

    def docs():
        yield np.arange(5)
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        writer.write_shard("part-0", docs(), flush_tokens=1)
    with pytest.raises(ValueError, match=r"input_ids/data has dtype int32, expected uint16"):
        ShardedCacheWriter(root, dtype="uint16", if_exists="resume").write_shard("part-0", [np.arange(5)])
    with pytest.raises(
        ValueError, match=r"cannot resume .*part-0 with field='text': it holds field\(s\) \['input_ids'\]"
    ):
        ShardedCacheWriter(root, field="text", if_exists="resume").write_shard("part-0", [np.arange(5)])


def test_adopting_a_finished_shard_checks_its_dtype(tmp_path):
    """A shard finished but not listed yet (killed before the top ledger) is adopted only if it matches."""
    root = str(tmp_path / "c")
    ShardedCacheWriter(root)
    with CacheWriter(os.path.join(root, "part-0"), dtype="int32") as shard:
        shard.write([np.arange(4)])
    with pytest.raises(
        ValueError, match=r"cannot adopt finished shard .*part-0: .*data has dtype int32, expected uint16"
    ):
        ShardedCacheWriter(root, dtype="uint16", if_exists="resume").write_shard("part-0", [np.arange(4)])
    resumed = ShardedCacheWriter(root, if_exists="resume")
    assert resumed.write_shard("part-0", None) == 1
    resumed.finish()
    assert TokenCache.open(root).num_rows == 1
