"""Preblocked stores, damaged or with hostile ids: every case a named error, never zeros or anomalies.

One small store is written once (text in, blocks of 32); each case damages a copy.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from meshbatch.cache import CacheIntegrityError
from meshbatch.cli import main
from meshbatch.datasets.preblocked import preblock
from meshbatch.datasets.preblocked.block_dataset import BlockDataset
from meshbatch.datasets.preblocked.block_sources import open_blocks
from meshbatch.datasets.preblocked.block_validation import validate_path

TEXTS = [f"document {i} " + "words " * (i % 13) for i in range(120)]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("preblocked")
    text = root / "docs.jsonl"
    with open(text, "w") as f:
        for t in TEXTS:
            f.write(json.dumps({"text": t}) + "\n")
    path = str(root / "store")
    preblock(path, [str(text)], block_size=32, key=1, progress=False)
    return path


@pytest.fixture
def copy(store, tmp_path) -> str:
    path = str(tmp_path / "copy")
    shutil.copytree(store, path)
    return path


def _text(store) -> str:
    return os.path.join(os.path.dirname(store), "docs.jsonl")


@pytest.mark.parametrize(
    "ids, message",
    [
        ({"pad_id": 65}, r"pad_id=65 is inside the vocabulary \[0, 257\)"),
        ({"doc_id": 97}, r"doc_id=97 is inside the vocabulary"),
        ({"doc_id": -1}, r"doc_id must be >= 0 \(got doc_id=-1\)"),
        ({"doc_id": 258}, r"doc_id and eod_id must differ \(got doc_id=258, eod_id=258\)"),
    ],
)
def test_preblock_refuses_structural_ids_that_are_tokens_negative_or_equal(store, tmp_path, ids, message):
    with pytest.raises(ValueError, match=message):
        preblock(str(tmp_path / "out"), [_text(store)], block_size=32, progress=False, **ids)
    assert not os.path.exists(tmp_path / "out")  # refused before anything is written


@pytest.mark.parametrize(
    "ids, message",
    [
        ({"doc_id": 258}, "doc_id and eod_id must differ"),
        ({"pad_id": 65}, "pad_id=65 is inside the vocabulary"),
        ({"eod_id": -3}, "eod_id must be >= 0"),
    ],
)
def test_validate_blocks_and_block_dataset_refuse_the_same_ids(store, ids, message, capsys):
    with pytest.raises(ValueError, match=message):
        validate_path(store, progress=False, **ids)
    with pytest.raises(ValueError, match=message):
        BlockDataset(store, **ids)
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in ids.items()]
    assert main(["validate-blocks", store, "--no-progress", *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_header_with_structural_ids_inside_the_vocabulary_is_refused(copy):
    file = os.path.join(copy, "preblock.json")
    with open(file) as f:
        header = json.load(f)
    header["eod_id"] = header["doc_id"]
    with open(file, "w") as f:
        json.dump(header, f)
    with pytest.raises(ValueError, match=r"preblock.json: doc_id and eod_id must differ"):
        BlockDataset(copy)


def test_a_header_that_is_a_json_list_is_named(copy, capsys):
    with open(os.path.join(copy, "preblock.json"), "w") as f:
        json.dump([1, 2], f)
    with pytest.raises(ValueError, match=r"preblock.json is not a preblock header \(a JSON list"):
        validate_path(copy, progress=False)
    assert main(["validate-blocks", copy, "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert "is not a preblock header (a JSON list, not an object)" in err and "Traceback" not in out + err


def test_a_missing_block_chunk_is_an_error_not_zeros(copy, capsys):
    os.unlink(os.path.join(copy, "blocks", "c", "0", "0"))
    source = open_blocks(copy)
    with pytest.raises(CacheIntegrityError, match=r"blocks in \[0, \d+\): read failed: NOT_FOUND"):
        source.read_blocks([0, 1])
    with pytest.raises(CacheIntegrityError, match="NOT_FOUND"):
        validate_path(copy, progress=False)
    assert main(["validate-blocks", copy, "--no-progress"]) == 2  # a read error, not anomalies (1)
    err = capsys.readouterr().err
    assert "cannot read" in err and "NOT_FOUND" in err and "content_outside_doc" not in err


def test_a_missing_real_tokens_chunk_is_an_error_not_a_child_consuming_nothing(copy):
    os.unlink(os.path.join(copy, "real_tokens", "c", "0"))
    with pytest.raises(CacheIntegrityError, match=r"real_tokens: cannot read blocks \[0, \d+\): .*NOT_FOUND"):
        BlockDataset(copy)  # a token-balanced mixture builds its counts from these


def _flip(file: str, at) -> None:
    with open(file, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(at(size))
        byte = f.read(1)[0]
        f.seek(at(size))
        f.write(bytes([byte ^ 0x01]))


@pytest.mark.parametrize(
    "at, message",
    [
        (lambda n: n // 2, "read failed: .*copy/blocks/c/0/0"),  # inside the compressed tokens
        (lambda n: n - 1, "read failed: DATA_LOSS.*copy/blocks/c/0/0.*Digest mismatch"),  # crc32c
    ],
)
def test_a_changed_byte_of_a_block_chunk_is_caught_on_read(copy, store, at, message):
    _flip(os.path.join(copy, "blocks", "c", "0", "0"), at)
    with pytest.raises(CacheIntegrityError, match=message):
        open_blocks(copy).read_blocks([0])
    with pytest.raises(CacheIntegrityError, match=message):
        validate_path(copy, progress=False)
    assert open_blocks(store).read_blocks([0]).shape == (1, 32)  # the original reads


def test_an_unreadable_blocks_directory_is_named_not_taken_for_a_token_cache(copy, capsys):
    os.unlink(os.path.join(copy, "blocks", "zarr.json"))
    with pytest.raises(
        FileNotFoundError, match=r"blocks/ is a preblocked store's blocks array, but it cannot be"
    ):
        validate_path(copy, progress=False)
    assert main(["validate-blocks", copy, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "jagged token cache" not in err
    if os.geteuid() != 0:  # permissions bind only a non-root user
        os.chmod(os.path.join(copy, "blocks"), 0)
        try:
            with pytest.raises(PermissionError, match="cannot be read"):
                validate_path(copy, progress=False)
        finally:
            os.chmod(os.path.join(copy, "blocks"), 0o755)


def _store_array(path: str, name: str):
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, name)}}
    return ts.open(spec, open=True).result()


def test_a_token_rewritten_through_tensorstore_is_caught_by_the_writers_sums(copy, monkeypatch):
    blocks = _store_array(copy, "blocks")
    original = blocks[3].read().result()
    changed = original.copy()
    changed[5] = changed[5] + 1 if changed[5] < 256 else 65  # a content token or padding, structure intact
    blocks[3].write(changed).result()  # re-encoded: its crc32c codec is valid again
    source = open_blocks(copy)
    with pytest.raises(
        CacheIntegrityError,
        match=rf"{copy}/blocks: chunk 0 \(blocks \[0, \d+\)\) fails its checksum: the writer recorded crc32",
    ):
        source.read_blocks([0])  # any block of the chunk: the chunk is checked on its first read
    monkeypatch.setenv("MESHBATCH_VERIFY_READS", "0")
    assert open_blocks(copy).read_blocks([3])[0, 5] == changed[5]  # verification off: served as stored


def test_real_tokens_rewritten_through_tensorstore_are_caught(copy):
    real = _store_array(copy, "real_tokens")
    real[0].write(0).result()  # a child that would count as consuming nothing in block 0
    with pytest.raises(
        CacheIntegrityError, match=r"real_tokens: chunk 0 \(blocks \[0, \d+\)\) fails its checksum"
    ):
        BlockDataset(copy)
