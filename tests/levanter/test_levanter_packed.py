"""``PackedDataset(compat="levanter")`` against Levanter's own packed datasets, row for row.

Levanter's ``MultiturnChatDataset`` and ``SupervisedDataset`` (``GreedyPrepackedDataset`` under
both, then their loss masks) read the same generated caches (written by Levanter's cache writer);
their ``LmExample``s for packed rows ``0 .. n-1`` equal the batches a ``Pipeline`` over
``PackedDataset(..., compat="levanter", shuffle=ShuffleSpec("none"))`` gives, row for row, on 1
and 8 devices and on 2 processes x 4 devices: tokens, loss masks and segment ids, with and without
prompt masking, packed and one example a row, with either slicing of long examples.
"""

import haliax as hax
import numpy as np
import pytest
from levanter.data.text import MultiturnChatDataset, SupervisedDataset
from levanter.store.cache import TreeCache
from meshes import mesh_of
from mp_harness import assemble, run_jobs
from packed_corpus import chat_examples, supervised_examples, write_chat_cache, write_supervised_cache

from meshbatch import PackedDataset, Pipeline, ShuffleSpec

SEQ = 32
N = 70
BATCH = 8
EXEMPLARS = {
    "chat": {"input_ids": np.zeros((0,), np.int32), "assistant_masks": np.zeros((0,), np.int32)},
    "supervised": {"input_ids": np.zeros((0,), np.int32), "sources_len": np.zeros((0,), np.int32)},
}
CASES = [  # (format, pack, mask_prompt, slice_strategy, max_segments)
    ("chat", True, True, "left", 64),
    ("chat", True, False, "left", 64),
    ("chat", False, True, "left", 64),
    ("chat", True, True, "right", 64),
    ("chat", True, True, "left", 2),
    ("supervised", True, True, "right", 64),
    ("supervised", True, False, "right", 64),
    ("supervised", False, True, "right", 64),
    ("supervised", True, True, "left", 64),
    ("supervised", True, True, "right", 3),
]


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("levanter_packed")
    return {
        "chat": write_chat_cache(root / "chat", chat_examples(5, N, max_len=45)),
        "supervised": write_supervised_cache(root / "supervised", supervised_examples(6, N, max_len=45)),
    }


def levanter_rows(path, fmt, pack, mask_prompt, slice_strategy, max_segments=64) -> dict[str, np.ndarray]:
    """Levanter's packed rows ``0 .. n-1``: tokens, loss_mask, segment_ids."""
    cache = TreeCache.load(path, EXEMPLARS[fmt])
    Pos = hax.Axis("position", SEQ)
    segments = max_segments if pack else 1  # Levanter's chat / supervised formats pass 64 or 1 for `pack`
    if fmt == "chat":
        dataset = MultiturnChatDataset(
            cache, Pos, max_segments_per_example=segments, slice_strategy=slice_strategy,
            mask_user_turns=mask_prompt,
        )  # fmt: skip
    else:
        dataset = SupervisedDataset(
            cache,
            Pos,
            max_segments_per_example=segments,
            mask_inputs=mask_prompt,
            slice_strategy=slice_strategy,
        )
    sync = dataset.as_sync_dataset()
    examples = sync.get_batch(list(range(len(sync))))
    out = {"tokens": [], "loss_mask": [], "segment_ids": []}
    for ex in examples:
        segment_ids = ex.attn_mask.segment_ids
        if isinstance(segment_ids, tuple):
            segment_ids = segment_ids[0]
        out["tokens"].append(np.asarray(ex.tokens.array))
        out["loss_mask"].append(np.asarray(ex.loss_mask.array))
        out["segment_ids"].append(np.asarray(segment_ids.array))
    return {k: np.stack(v).astype(np.int32) for k, v in out.items()}


def compat_dataset(path, pack, mask_prompt, slice_strategy, max_segments=64):
    return PackedDataset(
        path, SEQ, compat="levanter", pack=pack, mask_prompt=mask_prompt, slice_strategy=slice_strategy,
        max_segments=max_segments, shuffle=ShuffleSpec("none"),
    )  # fmt: skip


def compat_pipeline(mesh, *, path, pack=True, mask_prompt=True, slice_strategy=None, max_segments=64):
    dataset = compat_dataset(path, pack, mask_prompt, slice_strategy, max_segments)
    return Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=0), dict


def pipeline_rows(pipeline, rows: int) -> dict[str, np.ndarray]:
    steps = -(-rows // BATCH)
    got = {"tokens": [], "loss_mask": [], "segment_ids": []}
    for step in range(steps):
        batch = pipeline.batch(step)
        for name in got:
            got[name].append(np.asarray(getattr(batch, name)))
    return {k: np.concatenate(v)[:rows] for k, v in got.items()}


@pytest.mark.parametrize("fmt, pack, mask_prompt, slice_strategy, max_segments", CASES)
def test_compat_rows_equal_levanter(caches, fmt, pack, mask_prompt, slice_strategy, max_segments):
    want = levanter_rows(caches[fmt], fmt, pack, mask_prompt, slice_strategy, max_segments)
    pipeline, _ = compat_pipeline(
        mesh_of(1), path=caches[fmt], pack=pack, mask_prompt=mask_prompt, slice_strategy=slice_strategy,
        max_segments=max_segments,
    )  # fmt: skip
    assert pipeline._host.num_examples == want["tokens"].shape[0]
    got = pipeline_rows(pipeline, want["tokens"].shape[0])
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{fmt} {pack=} {mask_prompt=} {name}")
    assert (want["segment_ids"] >= 0).sum() > 0 and (want["loss_mask"] == 1).sum() > 0


def test_compat_rows_equal_levanter_on_8_devices(caches):
    for fmt in ("chat", "supervised"):
        want = levanter_rows(caches[fmt], fmt, True, True, "left" if fmt == "chat" else "right")
        pipeline, _ = compat_pipeline(mesh_of(8), path=caches[fmt])
        got = pipeline_rows(pipeline, want["tokens"].shape[0])
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{fmt} {name}")


def test_compat_rows_equal_levanter_on_two_processes(caches, tmp_path):
    steps = 3
    jobs = [
        ("test_levanter_packed:compat_pipeline", {"path": caches[fmt]}, steps)
        for fmt in ("chat", "supervised")
    ]
    launched = run_jobs(tmp_path, processes=2, local_devices=4, mesh_shape="8", jobs=jobs)
    for fmt, results in zip(("chat", "supervised"), launched, strict=True):
        want = levanter_rows(caches[fmt], fmt, True, True, "left" if fmt == "chat" else "right")
        for step in range(steps):
            for name, rows in want.items():
                expected = rows[step * BATCH : (step + 1) * BATCH]
                got = assemble(results, step=step, leaf=name, like=expected)
                np.testing.assert_array_equal(got, expected, err_msg=f"{fmt} {step=} {name}")
