"""Building caches from text / JSONL: byte and Hugging Face tokenizers, resume, progress, CLI."""

import gzip
import json

import numpy as np
import pytest
from levanter.store.cache import TreeCache

from meshbatch.cache import ByteTokenizer, HFTokenizer, TokenCache, build_cache, iter_documents
from meshbatch.cli import main

TEXTS = [f"document {i}: " + "héllo wörld " * (i % 5) for i in range(60)]


@pytest.fixture
def inputs(tmp_path):
    """TEXTS[:40] as JSONL (one of them gzipped), TEXTS[40:] as a one-document-per-line text file."""
    jsonl, gz, txt = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.txt"
    jsonl.write_text(
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS[:30])) + "\n"
    )
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in TEXTS[30:40])
    txt.write_text("\n".join(TEXTS[40:]) + "\n")
    return [str(jsonl), str(gz), str(txt)]


def _decoded(path: str) -> list[str]:
    cache = TokenCache.open(path)
    return [ByteTokenizer().decode(row) for row in cache.read_rows(np.arange(cache.num_rows))]


def test_build_with_byte_tokenizer(tmp_path, inputs):
    ledger = build_cache(str(tmp_path / "cache"), inputs, text_docs="line", dtype="uint16", progress=False)
    assert ledger.is_finished and ledger.total_num_rows == 60
    assert _decoded(str(tmp_path / "cache")) == TEXTS
    cache = TokenCache.open(str(tmp_path / "cache"))
    assert cache.dtype == np.uint16
    row = cache.read_rows([0])[0]
    assert row[-1] == ByteTokenizer.eos_id and bytes(row[:-1].tolist()).decode() == TEXTS[0]
    levanter = TreeCache.load(str(tmp_path / "cache"), {"input_ids": np.zeros((0,), np.uint16)})
    np.testing.assert_array_equal(levanter[59]["input_ids"], cache.read_rows([59])[0])


def test_text_file_is_one_document_by_default(tmp_path, inputs):
    build_cache(str(tmp_path / "cache"), inputs[2:], progress=False)
    assert _decoded(str(tmp_path / "cache")) == ["\n".join(TEXTS[40:]) + "\n"]
    assert list(iter_documents(inputs[2:], text_docs="line")) == TEXTS[40:]


def test_bad_jsonl_line_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=f"{bad}:2: expected a JSON object with a string 'text' field"):
        build_cache(str(tmp_path / "cache"), [str(bad)], progress=False)
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(ValueError, match=f"{bad}:2: not valid JSON"):
        list(iter_documents([str(bad)]))


def test_vocab_must_fit_dtype_and_inputs_must_exist(tmp_path, inputs):
    with pytest.raises(ValueError, match="dtype=uint8 cannot hold token ids up to 256"):
        build_cache(str(tmp_path / "c"), inputs, dtype="uint8")
    with pytest.raises(FileNotFoundError, match="input files not found"):
        build_cache(str(tmp_path / "c"), [str(tmp_path / "nope.txt")])


class _FlakyTokenizer(ByteTokenizer):
    """A byte tokenizer that counts what it encodes and can fail after ``fail_after`` documents."""

    def __init__(self, fail_after: int | None = None):
        super().__init__()
        self.encoded, self.fail_after = 0, fail_after

    def encode_batch(self, texts):
        if self.fail_after is not None and self.encoded + len(texts) > self.fail_after:
            raise RuntimeError("tokenizer died")
        self.encoded += len(texts)
        return super().encode_batch(texts)


def test_interrupted_build_resumes_without_retokenizing(tmp_path, inputs):
    out = str(tmp_path / "cache")
    kwargs = {"text_docs": "line", "batch_docs": 4, "flush_tokens": 500, "progress": False}
    with pytest.raises(RuntimeError, match="tokenizer died"):
        build_cache(out, inputs, tokenizer=_FlakyTokenizer(fail_after=45), **kwargs)
    committed = TokenCache.open(out, require_finished=False).num_rows
    assert 0 < committed < 45

    resumed = _FlakyTokenizer()
    build_cache(out, inputs, tokenizer=resumed, **kwargs)
    assert resumed.encoded == 60 - committed  # committed documents are skipped, not re-tokenized
    assert _decoded(out) == TEXTS

    again = _FlakyTokenizer()
    assert build_cache(out, inputs, tokenizer=again, **kwargs).total_num_rows == 60
    assert again.encoded == 0  # a finished build of the same inputs is returned as is


def test_resume_rejects_a_different_tokenizer(tmp_path, inputs):
    out = str(tmp_path / "cache")
    with pytest.raises(RuntimeError):
        build_cache(out, inputs, tokenizer=_FlakyTokenizer(fail_after=10), batch_docs=4, flush_tokens=50)
    with pytest.raises(ValueError, match=r"its ledger metadata .* differs"):
        build_cache(out, inputs, tokenizer=ByteTokenizer(add_eos=False), batch_docs=4)


def test_progress_bar_on_request(tmp_path, inputs, capsys):
    build_cache(str(tmp_path / "quiet"), inputs, progress=False)
    assert "building" not in capsys.readouterr().err
    build_cache(str(tmp_path / "loud"), inputs, progress=True)
    assert f"building {tmp_path / 'loud'}" in capsys.readouterr().err


@pytest.fixture
def tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "again": 3, "</s>": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def test_hf_tokenizer_from_local_file(tmp_path, tokenizer_json):
    text = tmp_path / "t.txt"
    text.write_text("hello world\nworld again zzz\n")
    tokenizer = HFTokenizer(tokenizer_json, eos_token="</s>")
    assert tokenizer.vocab_size == 5
    build_cache(str(tmp_path / "cache"), [str(text)], tokenizer=tokenizer, text_docs="line", progress=False)
    rows = TokenCache.open(str(tmp_path / "cache")).read_rows([0, 1])
    assert [r.tolist() for r in rows] == [[1, 2, 4], [2, 3, 0, 4]]

    with pytest.raises(ValueError, match="eos_token='<eos>' is not in the vocabulary"):
        HFTokenizer(tokenizer_json, eos_token="<eos>")
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        HFTokenizer(str(tmp_path / "missing.json"))


def test_cli_build_then_validate(tmp_path, inputs, tokenizer_json, capsys):
    out = str(tmp_path / "cache")
    assert main(["build-cache", out, *inputs, "--text-docs", "line", "--no-progress"]) == 0
    assert f"built {out}: 60 rows" in capsys.readouterr().out
    assert _decoded(out) == TEXTS
    assert main(["validate-cache", out]) == 0

    out_hf = str(tmp_path / "hf")
    args = [
        "build-cache",
        out_hf,
        inputs[2],
        "--tokenizer",
        tokenizer_json,
        "--eos-token",
        "</s>",
        "--no-progress",
    ]
    assert main(args) == 0
    assert TokenCache.open(out_hf).read_rows([0])[0][-1] == 4
