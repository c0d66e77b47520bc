"""Writes the examples' inputs: the demo's corpus (CPython's pydoc topics) as JSONL, one
validation document in ten, a byte-level Hugging Face tokenizer directory, and ``gpt2/``: the
reference directory Levanter's GPT-2 config loads (a ``GPT2Config`` and the byte tokenizer), in
place of the hub's ``gpt2``. Offline."""

import json
import pathlib
import sys

from meshbatch.cache import ByteTokenizer


def prepare(root: pathlib.Path) -> None:
    from pydoc_data.topics import topics

    from transformers import GPT2Config  # Levanter's dependency

    (root / "data").mkdir(parents=True, exist_ok=True)
    names = sorted(topics)
    for split, keep in (("train", lambda i: i % 10), ("validation", lambda i: not i % 10)):
        with open(root / "data" / f"{split}.jsonl", "w") as f:
            for i, name in enumerate(names):
                if keep(i):
                    f.write(json.dumps({"id": name, "text": topics[name]}) + "\n")
    ByteTokenizer().save_pretrained(str(root / "byte_tokenizer"))
    ByteTokenizer().save_pretrained(str(root / "gpt2"))  # Levanter's GPT-2 reference, offline
    GPT2Config(
        vocab_size=ByteTokenizer().vocab_size, n_positions=64, n_embd=64, n_layer=2, n_head=4
    ).save_pretrained(str(root / "gpt2"))


if __name__ == "__main__":
    prepare(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent))
