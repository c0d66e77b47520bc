"""Splice construction throughput: meshbatch's jitted kernels against per-example paths.

Method: one document of L = 45231 tokens, seq_len S = 4096, content_length K = 4096,
``slide_within``; B = 256 rows drawn once (fixed seed) from the schedule. Every path builds the
same ``[B, S]`` int32 tokens, loss mask and segment ids (checked equal before timing). Each path
is warmed up (compilation and two calls), then timed ``--repeats`` times with
``time.perf_counter`` around the call and ``jax.block_until_ready``; the table reports the median.

Rows, all in one run on one device:

* ``meshbatch build``: ``pool_frames`` from a device-resident pool, given ``(doc, t, s, copy_len)``.
* ``meshbatch plan+build``: ``schedule.lookup`` on row ids, then ``pool_frames``, one jitted call.
* ``numpy per-example``: the seed's Example Construction, a Python loop writing preallocated arrays.
* ``levanter per-example``: what a Levanter ``AsyncDataset`` does today: a numpy example per row,
  ``LmExample.causal(tokens, loss_mask=, segment_ids=)``, then ``stack_tree`` over the batch.
* ``ceiling``: moving three ``[B, S]`` int32 arrays (read + write), as a jitted XLA pass and as
  ``numpy.copyto`` into preallocated arrays; the faster is the memory-bandwidth ceiling our build is
  compared with.

Allocator: every jitted call returns fresh multi-MB output buffers. glibc's default hands such
blocks back to the kernel when they are freed, so each call page-faults its outputs in again and
XLA:CPU timings measure the kernel zeroing pages (several ms per batch, for any XLA program,
including the XLA ceiling row). A training process reuses its buffers; the benchmark therefore
asks glibc to keep freed blocks (``harness.keep_freed_memory``), which changes nothing for the numpy rows.
``--system-malloc`` keeps glibc's default to show the difference.

Usage: ``python benchmarks/bench_splice.py [--quick] [--repeats N]``; writes ``bench_splice.json``
next to this file.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import harness
import jax
import jax.numpy as jnp
import numpy as np

import meshbatch
from meshbatch.kernels import lookup_rows, pool_frames

SEQ_LEN, CONTENT_LENGTH, DOC_LENGTH, BATCH = 4096, 4096, 45231, 256
PAD = 0


def median_seconds(fn, repeats: int) -> float:
    """Median of ``repeats`` calls after two warm-up calls, each blocking on ``fn()``'s result."""
    return harness.median_seconds(lambda: jax.block_until_ready(fn()), repeats=repeats, warmup=2)


def numpy_per_example(doc, t, s, copy_len, out):
    tokens, loss_mask, segment_ids = out
    for i in range(t.shape[0]):
        tokens[i].fill(PAD)
        tokens[i, s[i] : s[i] + copy_len[i]] = doc[t[i] : t[i] + copy_len[i]]
        loss_mask[i].fill(0)
        loss_mask[i, s[i] : s[i] + copy_len[i] - 1] = 1
        segment_ids[i, : s[i]] = 0
        segment_ids[i, s[i] :] = 1
    return out


def levanter_per_example(doc, t, s, copy_len):
    import haliax as hax
    from levanter.data.loader import stack_tree
    from levanter.models.lm_model import LmExample

    Pos = hax.Axis("position", SEQ_LEN)
    examples = []
    for i in range(t.shape[0]):
        tokens = np.full(SEQ_LEN, PAD, dtype=np.int32)
        tokens[s[i] : s[i] + copy_len[i]] = doc[t[i] : t[i] + copy_len[i]]
        loss_mask = np.zeros(SEQ_LEN, dtype=np.int32)
        loss_mask[s[i] : s[i] + copy_len[i] - 1] = 1
        segment_ids = np.zeros(SEQ_LEN, dtype=np.int32)
        segment_ids[s[i] :] = 1
        examples.append(
            LmExample.causal(
                hax.named(tokens, Pos),
                loss_mask=hax.named(loss_mask, Pos),
                segment_ids=hax.named(segment_ids, Pos),
            )
        )
    return stack_tree(hax.Axis("batch", t.shape[0]), examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller Levanter sample")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's default trimming")
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 30)
    allocator = "glibc default" if args.system_malloc else harness.keep_freed_memory()
    print(f"jax {jax.__version__}  device: {jax.devices()[0].device_kind}  ({jax.devices()[0].platform})")
    print(f"allocator: {allocator}")

    doc = np.random.default_rng(0).integers(1, 50_000, DOC_LENGTH).astype(np.int32)
    spec = dict(
        seq_len=SEQ_LEN, content_length=CONTENT_LENGTH, content_start_mode="slide_within", pad_token_id=PAD
    )
    data = meshbatch.SpliceDataset([doc], **spec)
    rows = np.sort(np.random.default_rng(1).integers(0, len(data), BATCH)).astype(np.uint32)
    plan = [np.asarray(x) for x in data.schedule.lookup(rows)]
    _, t, s, copy_len = plan
    frame_args = data.frame_args

    build = jax.jit(lambda pool, d, t, s, c: pool_frames(pool, d, t, s, c, **frame_args))
    plan_build = jax.jit(lambda sched, pool, r: pool_frames(pool, *lookup_rows(sched, r, 0), **frame_args))
    device_plan = [jnp.asarray(x) for x in plan]
    device_rows = jnp.asarray(rows)

    want = build(data.pool, *device_plan)
    out = tuple(np.empty((BATCH, SEQ_LEN), np.int32) for _ in range(3))
    numpy_per_example(doc, t, s, copy_len, out)
    got = plan_build(data.schedule, data.pool, device_rows)
    for a, b, c in zip(
        (want.tokens, want.loss_mask, want.segment_ids), out, jax.tree.leaves(got)[:3], strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), b)
        np.testing.assert_array_equal(np.asarray(c), b)
    lev_rows = 32 if args.quick else BATCH
    lev = levanter_per_example(doc, t[:lev_rows], s[:lev_rows], copy_len[:lev_rows])
    np.testing.assert_array_equal(np.asarray(lev.tokens.array), out[0][:lev_rows])
    np.testing.assert_array_equal(np.asarray(lev.loss_mask.array), out[1][:lev_rows])

    arrays = tuple(jnp.asarray(x) for x in out)
    xla_copy = jax.jit(lambda salt, *xs: tuple(x ^ salt for x in xs))  # a traced salt: XLA cannot elide it
    dst = tuple(np.empty_like(x) for x in out)

    def numpy_copy():
        for d, x in zip(dst, out, strict=True):
            np.copyto(d, x)
        return dst

    timings = {
        "meshbatch build (pool_frames)": (
            median_seconds(lambda: build(data.pool, *device_plan), repeats),
            BATCH,
        ),
        "meshbatch plan+build (lookup + pool_frames)": (
            median_seconds(lambda: plan_build(data.schedule, data.pool, device_rows), repeats),
            BATCH,
        ),
        "numpy per-example (preallocated)": (
            median_seconds(lambda: numpy_per_example(doc, t, s, copy_len, out), repeats),
            BATCH,
        ),
        "levanter per-example (LmExample.causal + stack_tree)": (
            median_seconds(
                lambda: levanter_per_example(doc, t[:lev_rows], s[:lev_rows], copy_len[:lev_rows]),
                max(3, repeats // 6),
            ),
            lev_rows,
        ),
        "ceiling: XLA pass over 3 [B,S] int32": (
            median_seconds(lambda: xla_copy(jnp.int32(7), *arrays), repeats),
            BATCH,
        ),
        "ceiling: numpy.copyto 3 [B,S] int32": (median_seconds(numpy_copy, repeats), BATCH),
    }
    tokens_per_s = {name: rows_done * SEQ_LEN / sec for name, (sec, rows_done) in timings.items()}
    levanter = tokens_per_s["levanter per-example (LmExample.causal + stack_tree)"]
    ceiling = max(v for k, v in tokens_per_s.items() if k.startswith("ceiling"))
    print(f"S={SEQ_LEN} K={CONTENT_LENGTH} L={DOC_LENGTH} B={BATCH} repeats={repeats} (median)")
    print(f"{'path':<54} {'ms/batch':>10} {'Mtok/s':>10} {'x levanter':>11} {'of ceiling':>11}")
    results = []
    for name, (sec, rows_done) in timings.items():
        rate = tokens_per_s[name]
        ms_per_batch = sec * 1e3 * BATCH / rows_done
        vs_levanter, of_ceiling = rate / levanter, rate / ceiling
        print(
            f"{name:<54} {ms_per_batch:>10.3f} {rate / 1e6:>10.1f} {vs_levanter:>11.1f} {of_ceiling:>10.0%}"
        )
        results.append(
            dict(
                path=name,
                ms_per_batch=ms_per_batch,
                tokens_per_s=rate,
                vs_levanter=vs_levanter,
                of_ceiling=of_ceiling,
            )
        )
    report = dict(
        jax=jax.__version__,
        device=jax.devices()[0].device_kind,
        platform=jax.devices()[0].platform,
        config=dict(seq_len=SEQ_LEN, content_length=CONTENT_LENGTH, doc_length=DOC_LENGTH, batch=BATCH),
        repeats=repeats,
        quick=args.quick,
        allocator=allocator,
        results=results,
    )
    path = pathlib.Path(__file__).with_suffix(".json")
    if args.system_malloc:
        path = path.with_name(path.stem + "_system_malloc.json")
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
