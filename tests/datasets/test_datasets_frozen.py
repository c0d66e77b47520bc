"""Every dataset kind is a frozen value made by one factory.

Each kind (causal windows, both mixtures, packed examples with a key-free and a keyed packing, a
preblocked store, a cache packed on the fly, splice frames pooled and fetched) refuses an
assignment to any of its fields, declared or not, on the value a user constructs and on the host
half ``make(key)`` returns; ``make(key)`` gives ``(device half, host half)`` and leaves the
constructed value as it was (a host half for a key is a new value). A dataset that leaves a
declared field unset fails at construction, naming the field.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from packed_corpus import chat_examples, write_chat_cache

from meshbatch import (
    BlockDataset,
    CacheBlockDataset,
    CausalLMDataset,
    Mixture,
    PackedDataset,
    PackSpec,
    ShuffleSpec,
    SpliceLMDataset,
    TokenBalancedMixture,
)
from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.datasets import Dataset, DeviceDataset
from meshbatch.datasets.preblocked import preblock
from meshbatch.datasets.protocol import replace

SEQ = 16
BLOCK = 64
IDS = dict(doc_id=257, eod_id=258, pad_id=259, vocab_size=257)
SPLICE = dict(seq_len=SEQ, content_length=8, pad_token_id=0)
DECLARED = ("num_examples", "seq_len", "max_row_tokens", "spans_per_row", "sources", "content_margin")
KINDS = (
    "causal",
    "stable mixture",
    "token-balanced mixture",
    "packed",
    "packed, keyed packing",
    "preblocked",
    "packed on the fly",
    "splice pool",
    "splice fetched from a cache",
)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("frozen")
    with CacheWriter(str(root / "text")) as writer:
        writer.write([np.arange(3, 3 + 5 * SEQ, dtype=np.int32) + 100 * i for i in range(6)])
    text = root / "docs.jsonl"
    with open(text, "w") as f:
        for name in sorted(topics)[:4]:
            for para in topics[name].split("\n\n")[:6]:
                f.write(json.dumps({"text": para}) + "\n")
    store = str(root / "store")
    preblock(store, [str(text)], block_size=BLOCK, key=BlockDataset.pack_key(0), progress=False)
    chat = write_chat_cache(root / "chat", chat_examples(0, 30, max_len=12))
    return {"text": str(root / "text"), "store": store, "cache": os.path.join(store, "tokens"), "chat": chat}


def construct(kind: str, paths) -> Dataset:
    text = TokenCache.open(paths["text"])
    windows = {"a": CausalLMDataset(text, SEQ), "b": CausalLMDataset(text, SEQ, shuffle=ShuffleSpec("none"))}
    docs = [np.arange(1, 30, dtype=np.int32), np.arange(40, 90, dtype=np.int32)]
    made = {
        "causal": lambda: windows["a"],
        "stable mixture": lambda: Mixture(windows, {"a": 0.5, "b": 0.5}, block_size=4),
        "token-balanced mixture": lambda: TokenBalancedMixture(windows),
        "packed": lambda: PackedDataset(paths["chat"], SEQ, compat="levanter"),
        "packed, keyed packing": lambda: PackedDataset(paths["chat"], SEQ),
        "preblocked": lambda: BlockDataset(paths["store"]),
        "packed on the fly": lambda: CacheBlockDataset(paths["cache"], pack=PackSpec(BLOCK), **IDS),
        "splice pool": lambda: SpliceLMDataset(docs, **SPLICE),
        "splice fetched from a cache": lambda: SpliceLMDataset.from_cache(text, [0, 2], pool=False, **SPLICE),
    }
    return made[kind]()


def assert_frozen(dataset: Dataset) -> None:
    fields = {f.name for f in dataclasses.fields(dataset)}
    for name in fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(dataset, name, None)
    for name in DECLARED:  # a field, or (known once made for a key) a property over one
        assert name in fields or isinstance(getattr(type(dataset), name, None), property), name
        with pytest.raises(AttributeError):
            setattr(dataset, name, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        dataset.undeclared = 1  # not a field: refused as well


@pytest.mark.parametrize("kind", KINDS)
def test_every_dataset_is_frozen_and_made_by_make(paths, kind):
    dataset = construct(kind, paths)
    assert not hasattr(dataset, "device")  # one factory: make
    assert_frozen(dataset)
    before = {f.name: getattr(dataset, f.name) for f in dataclasses.fields(dataset)}
    device, host = dataset.make(jax.random.key(0))
    assert isinstance(device, DeviceDataset)
    assert type(host) is type(dataset)
    assert_frozen(host)
    assert host.num_examples >= 1 and host.seq_len == dataset.seq_len
    for name, value in before.items():  # making changed nothing of the constructed value
        assert getattr(dataset, name) is value, name
    keyed = kind in ("packed, keyed packing", "packed on the fly")
    assert (host is not dataset) == keyed  # a host half for a key is a new value
    if keyed:
        with pytest.raises(AttributeError, match=r"make\(key\)\[1\]\.num_examples"):
            dataset.num_examples  # noqa: B018 - known on the host half for a key only
        assert host.make(jax.random.key(0))[1] is host  # made already: its own host half


def test_a_dataset_that_leaves_a_field_unset_fails_at_construction():
    class Forgetful(Dataset):
        num_examples: int
        seq_len: int
        max_row_tokens: int
        spans_per_row: int = 1

        def __init__(self):
            self.num_examples, self.seq_len = 4, 8  # max_row_tokens forgotten

        def make(self, key):
            raise AssertionError("never made")

    with pytest.raises(TypeError, match="'max_row_tokens' was not initialized"):
        Forgetful()


def test_a_path_given_where_an_opened_cache_is_meant_is_named(paths):
    """``SpliceLMDataset.from_cache`` names a path given for the cache as ``CausalLMDataset`` does."""
    with pytest.raises(TypeError, match=r"source must be .* \(open a path with TokenCache\.open\(path\)\)"):
        CausalLMDataset(paths["text"], SEQ)
    with pytest.raises(TypeError, match=r"cache must be .* \(open a path with TokenCache\.open\(path\)\)"):
        SpliceLMDataset.from_cache(paths["text"], [0], **SPLICE)


def test_a_mixture_over_a_child_made_anew_is_made_anew(paths):
    """A child whose host half for a key is a new value gives its mixture a new host half over it:
    ``replace`` of the children and what derives from them; the constructed mixture keeps its own."""

    class Anew(CausalLMDataset):
        def make(self, key):
            device, _ = super().make(key)
            return device, replace(self, eos_id=self.eos_id)

    text = TokenCache.open(paths["text"])
    child, other = Anew(text, SEQ), CausalLMDataset(text, SEQ)
    mixtures = (
        Mixture({"a": child, "b": other}, {"a": 0.5, "b": 0.5}, block_size=4),
        TokenBalancedMixture({"a": child, "b": other}),
    )
    for mixture in mixtures:
        _, host = mixture.make(jax.random.key(0))
        assert type(host) is type(mixture) and host is not mixture
        assert mixture.children[0] is child and mixture.children[1] is other
        assert isinstance(host.children[0], Anew) and host.children[0] is not child
        assert type(host.children[1]) is CausalLMDataset and host.children[1].source is text
        assert len(host.sources) == 1 and host.sources[0] is text  # one source, the same object
        assert host.names == mixture.names and host.num_examples == mixture.num_examples
        assert_frozen(host)
