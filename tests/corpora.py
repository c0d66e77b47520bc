"""The documents, text files and caches the tests write, drawn the same way in every test, and
the splice frames several of them read from a cache.

Each helper draws from the ``rng`` it is given in the order the inline code it replaces did (a
document's length, then its tokens), so a fixture that calls it writes the same data as before and
the goldens computed from that data hold.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np

from meshbatch.cache import CacheWriter


def random_docs(
    rng: np.random.Generator,
    count: int,
    tokens: tuple[int, int],
    lengths: tuple[int, int] | int,
    *,
    offset: int = 0,
    eos: int | None = None,
) -> list[np.ndarray]:
    """``count`` int32 documents of tokens drawn from ``[tokens[0], tokens[1])`` plus ``offset``:
    each ``rng.integers(*lengths)`` long (or ``lengths`` long, a fixed int), followed by ``eos``
    when it is given."""
    docs = []
    for _ in range(count):
        length = lengths if isinstance(lengths, int) else rng.integers(*lengths)
        doc = offset + rng.integers(tokens[0], tokens[1], length)
        docs.append((doc if eos is None else np.append(doc, eos)).astype(np.int32))
    return docs


def write_docs(path: str | os.PathLike, docs: Sequence[np.ndarray]) -> str:
    """A meshbatch cache of ``docs`` at ``path``; returns the path as a string."""
    with CacheWriter(str(path)) as writer:
        writer.write(docs)
    return str(path)


def word_texts(
    rng: np.random.Generator, lengths: Iterable[int], words: Sequence[str], *, numbered: bool = False
) -> list[str]:
    """One text per length: that many words drawn from ``words``, after ``doc00 ``, ``doc01 ``, ...
    when ``numbered``."""
    return [
        (f"doc{i:02d} " if numbered else "") + " ".join(rng.choice(words, n)) for i, n in enumerate(lengths)
    ]


def topic_texts(topics: int, paragraphs: int | None = None, chars: int | None = None) -> list[str]:
    """Real English from CPython's pydoc topics (the demo's corpus), over the first ``topics``
    topics in name order: their first ``paragraphs`` paragraphs each, or each topic's first
    ``chars`` characters as one text."""
    from pydoc_data.topics import topics as pydoc_topics

    names = sorted(pydoc_topics)[:topics]
    if paragraphs is None:
        return [pydoc_topics[name][:chars] for name in names]
    return [para for name in names for para in pydoc_topics[name].split("\n\n")[:paragraphs]]


def write_jsonl(path: str | os.PathLike, texts: Iterable[str], key: str = "text") -> str:
    """``{key: text}`` a line; returns the path as a string."""
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({key: text}) + "\n")
    return str(path)


def edit_ledger(path: str | os.PathLike, **changes) -> None:
    """Overwrites fields of a cache's ``shard_ledger.json`` (a damaged or foreign ledger)."""
    ledger_path = os.path.join(path, "shard_ledger.json")
    with open(ledger_path) as f:
        ledger = json.load(f)
    ledger.update(changes)
    with open(ledger_path, "w") as f:
        json.dump(ledger, f)


def text_root(
    root: pathlib.Path,
    seed: int,
    lengths: tuple[int, int, int],
    words: Sequence[str],
    *,
    numbered: bool = False,
) -> pathlib.Path:
    """A folder for text configs: ``train.jsonl`` of ``word_texts`` (``lengths``: low, high and
    count of the word counts, drawn first) and ``tok``, the byte tokenizer saved."""
    from meshbatch.cache import ByteTokenizer

    rng = np.random.default_rng(seed)
    write_jsonl(root / "train.jsonl", word_texts(rng, rng.integers(*lengths), words, numbered=numbered))
    ByteTokenizer().save_pretrained(str(root / "tok"))
    return root


def sliding_frames(cache, seq_len: int, content_length: int, eos: int, **kwargs):
    """A ``SpliceLMDataset`` of every document of ``cache``: ``content_length`` tokens copied from
    each offset in turn (``slide_within``) into ``seq_len``-token frames padded with 0."""
    from meshbatch.datasets import SpliceLMDataset

    return SpliceLMDataset.from_cache(
        cache,
        np.arange(cache.num_rows),
        seq_len=seq_len,
        content_length=content_length,
        content_start_mode="slide_within",
        pad_token_id=0,
        eos_token_id=eos,
        **kwargs,
    )


def preblocked_per_level(root: pathlib.Path, text: str, **kwargs) -> dict[str, str]:
    """``preblock`` of ``text`` at each shuffle level, ``document`` and ``segment``: level -> the
    store at ``root / f"store-{level}"``."""
    from meshbatch.datasets.preblocked import preblock

    stores = {level: str(root / f"store-{level}") for level in ("document", "segment")}
    for level, path in stores.items():
        preblock(path, [text], shuffle_level=level, progress=False, **kwargs)
    return stores
