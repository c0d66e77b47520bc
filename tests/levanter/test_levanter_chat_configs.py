"""Issue 36: a Levanter ``data:`` block with chat and supervised formats gives, with one ``type:``
line, the batches Levanter's own config gives (its ``MultiturnChatDataset`` / ``SupervisedDataset``
packed rows, shuffled and mixed as Levanter does), through ``PipelineLoader`` (the fast path) and
``get_batch`` (``fast_path: false``, Levanter's ``DataLoader``): tokens, loss masks and segment ids.

* a mixture of a text, a chat and an unpacked supervised component (``pack: false``), for
  ``shuffle`` false, true (Feistel) and an era length;
* a chat source over two epochs (``epoch: 2``: Levanter's ``EpochDataset``), every row;
* a chat source's validation set (unshuffled packed rows, what Levanter evaluates);
* a Hugging Face ``id:`` chat source (``train_lm_llama3_tulu_sft.yaml``'s shape: a local
  directory ``datasets`` reads, nothing downloaded), shuffled.

The caches are built in process by meshbatch's builder (Levanter's processors and writer);
Levanter's configs then load them. The training runs are in tests/levanter/test_chat_train.py.
"""

import asyncio
import json
import textwrap

import draccus
import haliax as hax
import jax
import numpy as np
import pytest
from levanter.schedule import BatchSchedule

from meshbatch.cache import ByteTokenizer
from meshbatch.datasets.packed import PackedDataset
from meshbatch.levanter import MeshbatchDataset, PipelineLoader, fast
from meshbatch.levanter.train_lm import TrainLmConfig

SEQ, BATCH = 32, 4
Pos = hax.Axis("position", SEQ)
KEY = jax.random.PRNGKey(5)
WORDS = "the of and to in a is that for it as was with be by on not he this are".split()
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
    "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)
CHAT = f'{{type: chat, chat_template: "{TEMPLATE}"}}'
MIXTURE = f"""\
tokenizer: ROOT/tok
cache_dir: ROOT/cache/mixture
configs:
  owt: {{train_urls: [ROOT/web.jsonl]}}
  tulu: {{train_urls: [ROOT/chat.jsonl], format: {CHAT}}}
  sft: {{train_urls: [ROOT/supervised.jsonl], format: {{type: supervised, pack: false}}}}
train_weights: {{owt: 0.5, tulu: 0.3, sft: 0.2}}
mixture_block_size: 8
"""
SINGLE = f"""\
tokenizer: ROOT/tok
cache_dir: ROOT/cache/chat
train_urls: [ROOT/chat.jsonl]
validation_urls: [ROOT/chat_val.jsonl]
format: {CHAT}
"""
HF = f"""\
tokenizer: ROOT/tok
cache_dir: ROOT/cache/hf
id: ROOT/hf
format: {CHAT}
shuffle: true
"""


def _words(rng, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(low, high))))


def _chats(rng, n: int) -> str:
    out = []
    for _ in range(n):
        turns = []
        for _ in range(int(rng.integers(1, 3))):
            turns += [{"role": "user", "content": _words(rng, 1, 4) + "?"},
                      {"role": "assistant", "content": _words(rng, 1, 6) + "."}]  # fmt: skip
        out.append(json.dumps({"messages": turns}) + "\n")
    return "".join(out)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("chatcfg")
    rng = np.random.default_rng(11)
    (root / "chat.jsonl").write_text(_chats(rng, 40))
    (root / "chat_val.jsonl").write_text(_chats(rng, 12))
    (root / "hf").mkdir()
    (root / "hf" / "train.jsonl").write_text(_chats(rng, 30))
    with open(root / "supervised.jsonl", "w") as f:
        for _ in range(30):
            f.write(json.dumps({"prompt": _words(rng, 1, 5) + "?", "response": _words(rng, 1, 6)}) + "\n")
    with open(root / "web.jsonl", "w") as f:
        for _ in range(30):
            f.write(json.dumps({"text": _words(rng, 5, 40)}) + "\n")
    ByteTokenizer().save_pretrained(str(root / "tok"))
    return root


def parse(root, data: str):
    path = root / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(data.replace("ROOT", str(root)), "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[]).data


def leaves(example) -> dict[str, np.ndarray]:
    """An ``LmExample``'s (one row or a batch) tokens, loss mask and segment ids."""
    segment_ids = example.attn_mask.segment_ids
    segment_ids = segment_ids[0] if isinstance(segment_ids, tuple) else segment_ids
    arrays = {"tokens": example.tokens, "loss_mask": example.loss_mask, "segment_ids": segment_ids}
    return {k: np.asarray(a.array, np.int32) for k, a in arrays.items()}


def rows_of(examples) -> dict[str, np.ndarray]:
    rows = [leaves(ex) for ex in examples]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def levanter_rows(dataset, n: int) -> dict[str, np.ndarray]:
    with jax.numpy_dtype_promotion("standard"):  # Levanter's examples need JAX's standard promotion
        return rows_of(asyncio.run(dataset.get_batch(list(range(n)))))


def assert_rows_equal(got, want, what: str) -> None:
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{what} {name}")
    assert want["loss_mask"].sum() > 0 and (want["segment_ids"] >= 0).sum() > 0


def loader_rows(dataset: MeshbatchDataset, steps: int, fingerprint=None) -> dict[str, np.ndarray]:
    """The first ``steps`` batches of the fast path; ``fingerprint``: what the pipeline's
    ``content_fingerprint()`` must be (the one the train set noted for the checkpoints)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=BATCH)
    if fingerprint is not None:
        assert loader.pipeline.content_fingerprint() == fingerprint
    batches = [leaves(batch) for _, batch in zip(range(steps), loader.iter_from_step(0), strict=False)]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def both_paths_equal(ours_set: MeshbatchDataset, theirs_set, n: int, what: str, fingerprint=None) -> None:
    want = levanter_rows(theirs_set, n)
    assert_rows_equal(rows_of(asyncio.run(ours_set.get_batch(list(range(n))))), want, f"{what} get_batch")
    got = loader_rows(ours_set, -(-n // BATCH), fingerprint)
    assert_rows_equal({k: v[:n] for k, v in got.items()}, want, f"{what} PipelineLoader")


@pytest.mark.parametrize(
    ("shuffle", "permutation_type"), [("false", None), ("true", "feistel"), ("3", "linear")]
)
def test_a_mixture_of_text_chat_and_supervised_equals_levanter(root, shuffle, permutation_type):
    block = (
        MIXTURE
        + f"shuffle: {shuffle}\n"
        + (f"permutation_type: {permutation_type}\n" if permutation_type else "")
    )
    ours = parse(root, "type: stable_mixture\n" + block)
    ours_set = ours.train_set(Pos, BatchSchedule(BATCH), False, key=KEY)  # builds the caches
    children = dict(zip(ours_set.dataset.names, ours_set.dataset.children, strict=True))
    assert isinstance(children["tulu"], PackedDataset) and isinstance(children["sft"], PackedDataset)
    assert children["sft"].pack is False and children["tulu"].format == "chat"
    noted = fast._Noted.fingerprint  # issue 37: what each checkpoint records, Pipeline's
    assert noted is not None
    theirs = parse(root, block).train_set(Pos, BatchSchedule(BATCH), False, key=KEY)
    both_paths_equal(ours_set, theirs, 6 * BATCH, f"mixture shuffle={shuffle}", noted)


def test_a_chat_source_over_two_epochs_equals_levanter(root):
    block = SINGLE + "shuffle: true\n"
    ours_set = parse(root, "type: causal_lm\n" + block).train_set(Pos, None, False, key=KEY, epochs=2)
    theirs = parse(root, block).train_set(Pos, BatchSchedule(BATCH), False, key=KEY, epochs=2)
    n = 2 * ours_set.num_examples
    assert n == asyncio.run(theirs.async_len())
    both_paths_equal(ours_set, theirs, n, "two epochs")


def test_a_chat_sources_validation_set_equals_levanter(root):
    (ours,) = parse(root, "type: causal_lm\n" + SINGLE).validation_sets(Pos).values()
    (theirs,) = parse(root, SINGLE).validation_sets(Pos).values()
    assert isinstance(ours, MeshbatchDataset) and isinstance(ours.dataset, PackedDataset)
    n = asyncio.run(theirs.async_len())
    assert n == ours.num_examples
    both_paths_equal(ours, theirs, n, "validation")


def test_a_hugging_face_chat_source_equals_levanter(root):
    ours_set = parse(root, "type: hf_causal_lm\n" + HF).train_set(Pos, None, False, key=KEY)
    theirs = parse(root, HF).train_set(Pos, BatchSchedule(BATCH), False, key=KEY)
    both_paths_equal(ours_set, theirs, ours_set.num_examples, "hf chat")


def test_a_token_balanced_mixture_takes_a_chat_component(root):
    """``token_balanced_mixture`` (meshbatch's own order, no Levanter equal) mixes a chat component
    too: every row of its first steps is a text window or one of Levanter's packed chat rows of
    that cache, with Levanter's loss mask, and both kinds are drawn."""
    configs = f"""\
tokenizer: ROOT/tok
cache_dir: ROOT/cache/balanced
configs:
  owt: {{train_urls: [ROOT/web.jsonl]}}
  tulu: {{train_urls: [ROOT/chat.jsonl], format: {CHAT}}}
"""
    ours_set = parse(root, "type: token_balanced_mixture\n" + configs).train_set(Pos, None, False, key=KEY)
    chat = dict(zip(ours_set.dataset.names, ours_set.dataset.children, strict=True))["tulu"]
    theirs = parse(root, configs + "train_weights: {tulu: 1.0}\n").train_set(
        Pos, BatchSchedule(BATCH), False, key=KEY
    )
    want = levanter_rows(theirs, chat.num_examples)  # unshuffled: the packed rows in order
    masks = {tuple(t): m for t, m in zip(want["tokens"].tolist(), want["loss_mask"], strict=True)}
    got = loader_rows(ours_set, 6)
    chat_rows = [i for i, t in enumerate(got["tokens"].tolist()) if tuple(t) in masks]
    assert 0 < len(chat_rows) < got["tokens"].shape[0], chat_rows
    for i in chat_rows:
        np.testing.assert_array_equal(got["loss_mask"][i], masks[tuple(got["tokens"][i].tolist())])
