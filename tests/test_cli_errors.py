"""The ``meshbatch`` command fails in one line naming the problem; ``-v`` shows the traceback."""

import gzip
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.cli import main


@pytest.fixture
def not_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("first line\nna\xefve caf\xe9\n".encode("latin-1"))  # 0xef at byte 13, line 2
    return path


def test_undecodable_text_is_named_in_one_line(tmp_path, not_utf8, capsys):
    assert main(["build-cache", str(tmp_path / "c"), str(not_utf8), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        f"meshbatch build-cache: error: ValueError: {not_utf8}: not UTF-8 text: byte 0xef at byte offset 13 "
        "(line 2)"
    )


def test_undecodable_gzipped_text_names_the_decompressed_offset(tmp_path, capsys):
    path = tmp_path / "docs.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"text": "ok"}\n{"text": "\xff"}\n')
    assert main(["build-cache", str(tmp_path / "c"), str(path), "--no-progress"]) == 1
    assert "byte 0xff at byte offset 25 of the decompressed text (line 2)" in capsys.readouterr().err


def test_verbose_shows_the_traceback(tmp_path, not_utf8):
    with pytest.raises(ValueError, match="not UTF-8 text") as info:
        main(["-v", "build-cache", str(tmp_path / "c"), str(not_utf8), "--no-progress"])
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


@pytest.mark.parametrize(
    "dtype, message",
    [
        ("float32", "argument --dtype: 'float32' is not an integer dtype"),
        ("banana", "argument --dtype: 'banana' is not a numpy dtype"),
    ],
)
def test_non_integer_dtype_is_refused_by_name(tmp_path, dtype, message, capsys):
    text = tmp_path / "a.txt"
    text.write_text("hello")
    with pytest.raises(SystemExit) as exit_info:
        main(["build-cache", str(tmp_path / "c"), str(text), "--dtype", dtype])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["build-cache", "{tmp}/c", "{tmp}/missing.txt"], "FileNotFoundError: input files not found"),
        (["build-cache", "{tmp}/c", "{tmp}/a.txt", "--eos-token", "</s>"], "ValueError: --eos-token needs"),
        (["build-cache", "{tmp}/c", "{tmp}/a.txt", "--dtype", "uint8"], "dtype=uint8 cannot hold token ids"),
        (["validate-cache", "{tmp}/c", "--field", ""], "ValueError: field must not be empty"),
    ],
)
def test_other_failures_are_one_line(tmp_path, argv, message, capsys):
    (tmp_path / "a.txt").write_text("hello")
    assert main([arg.format(tmp=tmp_path) for arg in argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_validate_cache_deep_reports_what_it_read(tmp_path, capsys):
    path = str(tmp_path / "c")
    with CacheWriter(path) as writer:
        writer.write([np.arange(100, dtype=np.int32)] * 3)
    assert main(["validate-cache", path]) == 0
    out = capsys.readouterr().out
    assert "checked     metadata only" in out and "checksums   present (verify with --deep)" in out
    assert main(["validate-cache", path, "--deep", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "every chunk decoded: 2 chunks" in out and "checksums   present, 2 chunks verified" in out


def test_the_installed_command_prints_no_traceback(tmp_path, not_utf8):
    run = subprocess.run(
        [sys.executable, "-m", "meshbatch", "build-cache", str(tmp_path / "c"), str(not_utf8)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert f"{not_utf8}: not UTF-8 text" in run.stderr


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "lone.jsonl",
            b'{"text": "ok"}\n{"text": "a\\ud800b"}\n',
            "lone.jsonl:2: the 'text' field holds a lone surrogate",
        ),
        ("bad.jsonl.gz", b"\x1f\x8b\x08\x00garbage, not deflate", "bad.jsonl.gz is not a complete gzip file"),
        (
            "cut.txt.gz",
            gzip.compress(b"hello world " * 100, mtime=0)[:40],
            "cut.txt.gz is not a complete gzip file",
        ),
    ],
)
def test_undecodable_inputs_name_the_file_and_line(tmp_path, name, content, message, capsys):
    (tmp_path / name).write_bytes(content)
    assert main(["build-cache", str(tmp_path / "c"), str(tmp_path / name), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert f"{tmp_path / name}" in err


def test_a_garbage_tokenizer_file_is_named(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "tok.json").write_text("this is not a tokenizer")
    argv = [
        "build-cache",
        str(tmp_path / "c"),
        str(tmp_path / "a.txt"),
        "--tokenizer",
        str(tmp_path / "tok.json"),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"tokenizer: {tmp_path / 'tok.json'} is not a Hugging Face tokenizer.json" in err
    assert err.count("\n") == 1 and not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "metadata, error, message",
    [
        (
            {"f": open},
            TypeError,
            "metadata must be JSON-serialisable: Object of type builtin_function_or_method",
        ),
        ({"x": float("nan")}, ValueError, "metadata must be finite JSON"),
        ({"s": {1, 2}}, TypeError, "metadata must be JSON-serialisable: Object of type set"),
    ],
)
def test_metadata_json_cannot_hold_is_refused_by_name(tmp_path, metadata, error, message):
    with pytest.raises(error, match=message):
        CacheWriter(str(tmp_path / "c"), metadata=metadata)
    assert not (tmp_path / "c").exists()


def test_ctrl_c_exits_quietly_and_the_rerun_resumes(tmp_path):
    """SIGINT while build-cache writes: one line saying how to resume, exit 130; the rerun finishes."""
    text = tmp_path / "docs.txt"
    text.write_text("".join(f"document number {i} " * (i % 7 + 1) + "\n" for i in range(50_000)))
    out, argv = tmp_path / "c", [sys.executable, "-m", "meshbatch", "build-cache"]
    argv += [str(tmp_path / "c"), str(text), "--text-docs", "line", "--no-progress"]
    child = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # until the first commit (60 s at most)
            if (out / "shard_ledger.json").exists() or child.poll() is not None:
                break
            time.sleep(0.1)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode == 0:
        pytest.skip("the build finished before the interrupt reached it")
    assert child.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted; the rows committed so far are kept: run the same command again to resume" in err
    assert main(argv[3:]) == 0
    assert TokenCache.open(str(out)).num_rows == 50_000
