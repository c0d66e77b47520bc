"""Issue 36, must-show 2 (and issue 37's content fingerprint): chat and supervised Levanter
``data:`` blocks train on the fast path, resume exactly and equal Levanter's own loader.

Three blocks as Levanter's config tree writes them, over a small corpus generated here (chat
messages, prompt/response pairs, text; the byte tokenizer of the other tests, its chat template in
the format as Levanter reads it):

* a chat source (``format: {type: chat, ...}``, ``shuffle: true``);
* a supervised source (``format: {type: supervised}``, an era shuffle ``shuffle: 8``);
* a mixture of a text and a chat component (``gpt2_small_fast_mix_chat.yaml``'s shape: ``configs``
  with a ``format: {type: chat}`` component, ``train_weights``; ``shuffle: true`` as
  ``train_lm_llama3_tulu_sft.yaml``), refused by meshbatch before.

For each, three ``train_lm`` runs of a tiny Llama (6 steps, a checkpoint at step 3, the harness of
``test_resume_order.py``): ``ours`` (``python -m meshbatch.levanter.train_lm``, the block with one
``type:`` line): its start line says the fast path (``PackedDataset`` rows through ``Pipeline``),
its checkpoint's data-order record names the packed source (``format``, ``pack``) and holds the
content fingerprint, also in the tracker's summary; ``theirs`` (``python -m
levanter.main.train_lm``, the block as it is): the same losses, bit for bit; ``resumed`` (``ours``'
step-3 checkpoint, resumed by ``ours``): the losses of steps 4 and 5 equal the uninterrupted run's,
and its log says the content fingerprint is the checkpoint's. Last, the chat checkpoint resumed
over a re-bucketed corpus (one more conversation, another cache) logs a WARNING naming both
fingerprints and trains on (see docs/levanter.md "Resuming over other content").
"""

import json
import pathlib
import re

import numpy as np
import pytest
from test_resume_order import CHECKPOINT, OURS, STEPS, THEIRS, WORDS, losses, resume_from, run

from meshbatch.cache import ByteTokenizer

pytestmark = pytest.mark.train
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
    "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)
ESCAPED = TEMPLATE.replace("{", "{{").replace("}", "}}")  # the harness formats blocks with {root}
CHAT_FORMAT = f'{{{{type: chat, chat_template: "{ESCAPED}"}}}}'
CHAT = f"""\
tokenizer: {{root}}/tok
cache_dir: {{root}}/cache/{{chat}}
train_urls: [{{root}}/{{chat}}.jsonl]
format: {CHAT_FORMAT}
shuffle: true
"""
SUPERVISED = """\
tokenizer: {root}/tok
cache_dir: {root}/cache/supervised
train_urls: [{root}/supervised.jsonl]
format: {{type: supervised}}
shuffle: 8
"""
MIXTURE = f"""\
configs:
  owt: {{{{train_urls: [{{root}}/web.jsonl]}}}}
  tulu:
    train_urls: [{{root}}/chat.jsonl]
    format: {CHAT_FORMAT}
train_weights: {{{{owt: 0.6, tulu: 0.4}}}}
tokenizer: {{root}}/tok
cache_dir: {{root}}/cache/mixture
mixture_block_size: 8
shuffle: true
"""


def _words(rng, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(low, high))))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("chat_train")
    rng = np.random.default_rng(7)
    chats = []
    for _ in range(60):
        turns = []
        for _ in range(int(rng.integers(1, 3))):
            turns += [{"role": "user", "content": _words(rng, 1, 3) + "?"},
                      {"role": "assistant", "content": _words(rng, 1, 5) + "."}]  # fmt: skip
        chats.append(json.dumps({"messages": turns}) + "\n")
    (root / "chat.jsonl").write_text("".join(chats))
    # the same conversations re-bucketed: one more (another cache: another content fingerprint)
    more = {"messages": [{"role": "user", "content": "and?"}, {"role": "assistant", "content": "the end."}]}
    (root / "rebucketed.jsonl").write_text("".join(chats) + json.dumps(more) + "\n")
    with open(root / "supervised.jsonl", "w") as f:
        for _ in range(60):
            f.write(json.dumps({"prompt": _words(rng, 1, 4) + "?", "response": _words(rng, 1, 5)}) + "\n")
    with open(root / "web.jsonl", "w") as f:
        for _ in range(40):
            f.write(json.dumps({"text": "web: " + _words(rng, 10, 40)}) + "\n")
    ByteTokenizer().save_pretrained(str(root / "tok"))
    return root


def _block(block: str, **names) -> str:
    return block.replace("{chat}", names.get("chat", "chat")) if "{chat}" in block else block


def three_runs(root, name: str, block: str, kind: str) -> tuple[dict, str, dict]:
    """``ours``, ``theirs`` and ``ours`` resumed at step ``CHECKPOINT``; returns ``ours``' metrics
    and log and its checkpoint's data-order file."""
    ours, log = run(root, f"{name}-ours", OURS, f"type: {kind}\n" + block)
    want = losses(ours)
    assert sorted(want) == list(range(STEPS)), sorted(want)
    saved = root / "ckpt" / f"{name}-ours" / "run" / f"step-{CHECKPOINT}" / "meshbatch_data_order.json"
    record = json.loads(saved.read_text())
    fingerprint = record["content_fingerprint"]
    assert re.fullmatch(r"[0-9a-f]{32}", fingerprint), record
    assert ours["summary"]["meshbatch/content_fingerprint"] == fingerprint
    assert f"content_fingerprint={fingerprint}" in log
    theirs, _ = run(root, f"{name}-theirs", THEIRS, block)
    assert losses(theirs) == want  # Levanter's own packed dataset and loader: the same batches
    resume_from(root, f"{name}-ours", f"{name}-resumed")
    resumed, resumed_log = run(root, f"{name}-resumed", OURS, f"type: {kind}\n" + block)
    after = losses(resumed)
    assert sorted(after) == list(range(CHECKPOINT + 1, STEPS)), sorted(after)
    assert after == {s: want[s] for s in after}  # exact resume
    assert "was trained in this run's data order" in resumed_log
    assert f"was trained on this content (fingerprint {fingerprint})" in resumed_log
    return ours, log, record


def _start_line(log: str, kind: str) -> str:
    return next(line for line in log.splitlines() if f"meshbatch: data type={kind}" in line)


def test_a_chat_source_trains_on_the_fast_path_resumes_and_equals_levanter(root):
    ours, log, record = three_runs(root, "chat", _block(CHAT), "causal_lm")
    line = _start_line(log, "causal_lm")
    assert "loader=fast path (meshbatch.Pipeline" in line, line
    assert '"format": "chat", "pack": true' in line, line
    assert record["order"]["sources"][""] == {
        "shuffle": True, "permutation_type": "linear", "compat": "levanter", "format": "chat", "pack": True,
    }  # fmt: skip
    assert ours["summary"]["meshbatch/fast_path"] is True
    assert ours[0]["data/meshbatch/default/rows"] > 0  # the packed rows' input_ids spans were read
    # issue 37: the checkpoint resumed over a re-bucketed corpus: a WARNING naming both fingerprints
    resume_from(root, "chat-ours", "chat-rebucketed")
    other, other_log = run(
        root, "chat-rebucketed", OURS, "type: causal_lm\n" + _block(CHAT, chat="rebucketed"),
        "--trainer.num_train_steps", str(CHECKPOINT + 2),
    )  # fmt: skip
    now = other["summary"]["meshbatch/content_fingerprint"]
    assert now != record["content_fingerprint"]
    warning = next(line for line in other_log.splitlines() if "was trained on other content" in line)
    assert "WARNING" in warning, warning
    saved = record["content_fingerprint"]
    assert f"content fingerprint {saved} in the checkpoint, {now} in this run" in warning
    assert sorted(losses(other)) == [CHECKPOINT + 1]  # resumed (not refused), in the same data order


def test_a_supervised_source_trains_on_the_fast_path_resumes_and_equals_levanter(root):
    _, log, record = three_runs(root, "supervised", SUPERVISED, "causal_lm")
    assert "loader=fast path (meshbatch.Pipeline" in _start_line(log, "causal_lm")
    assert record["order"]["sources"][""] == {
        "shuffle": 8, "permutation_type": "linear", "compat": "levanter", "format": "supervised",
        "pack": True,
    }  # fmt: skip


@pytest.mark.slow  # three runs of a two-component mixture
def test_a_mixture_of_text_and_chat_trains_on_the_fast_path_resumes_and_equals_levanter(root):
    ours, log, record = three_runs(root, "mixture", MIXTURE, "stable_mixture")
    line = _start_line(log, "stable_mixture")
    assert "loader=fast path (meshbatch.Pipeline" in line, line
    assert "owt=levanter {" in line and 'tulu=levanter {"shuffle": true' in line, line
    sources = record["order"]["sources"]
    assert sources["tulu"]["format"] == "chat" and "format" not in sources["owt"], sources
    assert {"data/meshbatch/owt/rows", "data/meshbatch/tulu/rows"} <= set(ours[0]), sorted(ours[0])
