"""Preblocked data: the packing plan, the structure validator, and the pipeline with masking.

Method: every row is timed in this one process, warmed up first (compilation and one call), then
``--repeats`` calls timed with ``time.perf_counter`` around the call and ``jax.block_until_ready``;
the table reports the median. Ours and the baseline side by side, with the ratio:

* packing plan, docs/s: ``pack_plan`` (jitted; ``greedy`` and buffered ``ffd`` with 1024-document
  buffers) against a plain Python greedy loop (the obvious per-document loop) and a plain Python
  first-fit-decreasing loop, on the same document lengths: resampled from the paragraph lengths of
  CPython's pydoc topics (median 113 bytes), block size 128. The Python rows run on fewer documents
  (they are per-document loops; docs/s does not depend on the count). Fill is reported for both rules.
* validator, blocks/s: ``validate_blocks`` (jitted, 1024 blocks per call, carry and heuristics on)
  on blocks already on the device, and ``validate_array`` end to end (host array in, anomaly list
  out), against a straightforward Python validator (a per-token loop, same rules) on a subset.
* pipeline, tokens/s: the build kernel alone on a resident batch of 256 x 128, without and with
  the ``MLMMasking`` stage; then ``Pipeline(BlockDataset(chunk*.npy))`` batches of 256 x 128
  random blocks (plan, coalesced read, build), without and with the stage, on 1 device and on all
  the host's devices, steps interleaved so that a noisy spell hits both; median step time.

Usage: ``python benchmarks/bench_preblock.py [--quick] [--repeats N]``; writes
``bench_preblock.json`` next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import harness
import jax
import jax.numpy as jnp
import numpy as np

from meshbatch.datasets.preblocked.block_validation import validate_array
from meshbatch.kernels import block_batch, pack_plan, validate_blocks

S = 128
D, E, P, V = 257, 258, 259, 257


def paragraph_lengths() -> np.ndarray:
    from pydoc_data.topics import topics

    return np.array(
        [len(p.encode()) for name in sorted(topics) for p in topics[name].split("\n\n") if p.strip()]
    )


def python_greedy(lengths) -> int:
    """The obvious loop: next-fit, a long document continues the stream."""
    block, used = -1, S
    out = []
    for length in lengths:
        size = length + 2
        if (used == S) if size > S else (used + size > S):
            block, used = block + 1, 0
        out.append((block, used))
        end = used + size
        block, used = block + (end - 1) // S, (end - 1) % S + 1
    return block + 1


def python_ffd(lengths, buffer_docs: int = 1024) -> int:
    """First-fit decreasing within buffers, a list scan per document."""
    blocks = 0
    for lo in range(0, len(lengths), buffer_docs):
        buf = sorted((length + 2 for length in lengths[lo : lo + buffer_docs]), key=lambda s: -min(s, S + 1))
        free: list[int] = []
        for size in buf:
            if size > S:
                last = free[-1] if free else 0
                if free:
                    free[-1] = 0
                rest = size - last
                full = -(-rest // S) - 1
                blocks += full
                free.append(S - (rest - full * S))
                continue
            for j, f in enumerate(free):
                if f >= size:
                    free[j] -= size
                    break
            else:
                free.append(S - size)
        blocks += len(free)
    return blocks


def python_validate(blocks: np.ndarray, window: int = 8) -> int:
    """Straightforward per-token validator (carry_open_doc, literal heuristics); anomaly count."""
    found, carried = 0, False
    structural = (D, E, P)
    for block in blocks.tolist():
        is_open, implicit = carried, False
        for i, tok in enumerate(block):
            if tok not in structural and not 0 <= tok < V:
                found += 1
            elif i and block[i - 1] == P and tok != P:
                found += 1
            if tok == D:
                flanked = (i == 0 or block[i - 1] in structural) and (
                    i == S - 1 or block[i + 1] in structural
                )
                if not (is_open and flanked):
                    found += is_open
                    is_open, implicit = True, False
            elif tok == E:
                if is_open:
                    is_open = False
                elif D in block[i + 1 : i + 1 + window]:
                    found += 1
            elif tok != P and not is_open:
                found += 1
                is_open, implicit = True, True
        carried = is_open and not implicit
    return found + carried  # a document still open at the end of the data


def timed(fn, repeats: int) -> float:
    return harness.median_seconds(lambda: jax.block_until_ready(fn()), repeats=repeats, warmup=1)


def packed_blocks(lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    placement = pack_plan(jnp.asarray(lengths, jnp.int32), block_size=S, rule="ffd")
    n_blocks = int(placement.num_blocks)
    flat = np.full(n_blocks * S, P, np.int32)
    rng = np.random.default_rng(seed)
    starts = np.asarray(placement.block).astype(np.int64) * S + np.asarray(placement.offset)
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        flat[start] = D
        flat[start + 1 : start + 1 + length] = rng.integers(0, V, length)
        flat[start + 1 + length] = E
    return flat.reshape(n_blocks, S)


def bench_packing(args, rows, lengths_pool) -> None:
    rng = np.random.default_rng(0)
    n = 100_000 if args.quick else 1_000_000
    n_py = 20_000 if args.quick else 100_000
    lengths = rng.choice(lengths_pool, n)
    device = jnp.asarray(lengths, jnp.int32)
    results = {}
    for rule in ("greedy", "ffd"):
        seconds = timed(lambda rule=rule: pack_plan(device, block_size=S, rule=rule), args.repeats)
        blocks = int(pack_plan(device, block_size=S, rule=rule).num_blocks)
        results[f"jitted {rule}"] = (n / seconds, (lengths.sum() + 2 * n) / (blocks * S))
    small = lengths[:n_py].tolist()
    for name, fn in (("python greedy", python_greedy), ("python ffd", python_ffd)):
        seconds = statistics.median(_wall(lambda fn=fn: fn(small)) for _ in range(max(1, args.repeats // 3)))
        blocks = fn(small)
        results[name] = (n_py / seconds, (sum(small) + 2 * n_py) / (blocks * S))
    base = results["python greedy"][0]
    print(f"\n## packing plan: block_size {S}, {n:,} documents ({n_py:,} for the Python loops)")
    print(f"{'rule':<16} {'docs/s':>14} {'vs python greedy':>17} {'fill':>8}")
    for name, (rate, fill) in results.items():
        print(f"{name:<16} {rate:>14,.0f} {rate / base:>16.2f}x {fill:>8.4f}")
        rows.append(
            {"section": "packing", "row": name, "docs_per_s": rate, "ratio": rate / base, "fill": fill}
        )


def bench_validator(args, rows, lengths_pool) -> None:
    rng = np.random.default_rng(1)
    blocks = packed_blocks(rng.choice(lengths_pool, 8_000 if args.quick else 40_000))
    batch = 1024
    n = blocks.shape[0] // batch * batch
    device = jnp.asarray(blocks[:n].reshape(-1, batch, S))
    kw = dict(doc_id=D, eod_id=E, pad_id=P, vocab_size=V, carry_open_doc=True, literal_heuristics=True)

    def kernel_pass():
        carry = jnp.bool_(False)
        out = None
        for i in range(device.shape[0]):
            out = validate_blocks(
                device[i], jnp.int32(batch), carry, jnp.bool_(i == device.shape[0] - 1), **kw
            )
            carry = out.carry_out
        return out

    kernel_s = timed(kernel_pass, args.repeats)
    kw_array = {k: v for k, v in kw.items() if k in ("carry_open_doc", "literal_heuristics")}
    ids = dict(doc_id=D, eod_id=E, pad_id=P, vocab_size=V)
    end_to_end_s = timed(lambda: validate_array(blocks[:n], **ids, **kw_array), args.repeats)
    subset = blocks[: 256 if args.quick else 1024]
    python_s = statistics.median(
        _wall(lambda: python_validate(subset)) for _ in range(max(1, args.repeats // 3))
    )
    assert python_validate(subset) == len(validate_array(subset, **ids, **kw_array).anomalies)
    results = {
        "jitted kernel (on device)": n / kernel_s,
        "validate_array end to end": n / end_to_end_s,
        "python per-token loop": subset.shape[0] / python_s,
    }
    base = results["python per-token loop"]
    print(f"\n## validator: {n:,} blocks of {S} (Python loop on {subset.shape[0]:,}); carry + heuristics")
    print(f"{'path':<28} {'blocks/s':>14} {'vs python':>10}")
    for name, rate in results.items():
        print(f"{name:<28} {rate:>14,.0f} {rate / base:>9.1f}x")
        rows.append({"section": "validator", "row": name, "blocks_per_s": rate, "ratio": rate / base})


def bench_pipeline(args, rows, lengths_pool) -> None:
    from meshbatch import Pipeline
    from meshbatch.datasets import Plan, Rows
    from meshbatch.datasets.preblocked import BlockDataset

    batch_size = 256
    blocks = packed_blocks(np.random.default_rng(2).choice(lengths_pool, 20_000))
    with tempfile.TemporaryDirectory() as tmp:
        chunks = pathlib.Path(tmp) / "chunks"
        chunks.mkdir()
        np.save(chunks / "chunk0.npy", blocks)
        (chunks / "preblock.json").write_text(json.dumps(_header(blocks)))
        dataset = BlockDataset(str(chunks))
        stage = dataset.masking(3)
        # the build kernel alone, on a resident batch, without and with the masking stage
        tokens = jnp.asarray(blocks[:batch_size])
        n = jnp.arange(batch_size, dtype=jnp.uint32)
        plan = Plan(rows=Rows(position=n, epoch=n * 0), source=jnp.zeros(batch_size, jnp.int32), example=n)
        build = jax.jit(lambda t: block_batch(t, doc_id=D, eod_id=E, pad_id=P))
        build_mask = jax.jit(lambda s, t, p: s(block_batch(t, doc_id=D, eod_id=E, pad_id=P), p))
        kernels = {
            "build kernel": lambda: build(tokens),
            "build kernel + MLM masking": lambda: build_mask(stage, tokens, plan),
        }
        times = harness.rotating_times(
            {k: (lambda f=f: jax.block_until_ready(f())) for k, f in kernels.items()},
            rounds=3,
            repeats=args.repeats,
        )
        results = {k: batch_size * S / statistics.median(v) for k, v in times.items()}
        # the pipeline end to end: plan, coalesced read of random blocks, build per device
        steps = 6 if args.quick else 20
        for devices in sorted({1, jax.device_count()}):
            mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
            pipelines = {
                f"pipeline, {devices} device(s)": Pipeline(dataset, mesh=mesh, batch_size=batch_size, key=0),
                f"pipeline + MLM masking, {devices} device(s)": Pipeline(
                    dataset, mesh=mesh, batch_size=batch_size, key=0, stages=[stage]
                ),
            }
            per_step: dict[str, list[float]] = {name: [] for name in pipelines}
            for p in pipelines.values():
                jax.block_until_ready(p.batch(0))
            for step in range(1, steps + 1):  # interleaved: a noisy spell hits both
                for name, p in pipelines.items():
                    per_step[name].append(_wall(lambda p=p, step=step: jax.block_until_ready(p.batch(step))))
            results.update({k: batch_size * S / statistics.median(v) for k, v in per_step.items()})
    print(f"\n## build and pipeline: batches of {batch_size} x {S} random blocks")
    print(f"{'path':<44} {'tokens/s':>14}")
    for name, rate in results.items():
        print(f"{name:<44} {rate:>14,.0f}")
        rows.append({"section": "pipeline", "row": name, "tokens_per_s": rate})


def _header(blocks: np.ndarray) -> dict:
    return {
        "format": "meshbatch.preblock",
        "version": 1,
        "block_size": S,
        "num_blocks": int(blocks.shape[0]),
        "doc_id": D,
        "eod_id": E,
        "pad_id": P,
        "vocab_size": V,
        "shuffle_level": "none",
        "rule": "ffd",
        "buffer_docs": 1024,
        "escape_literal_markers": False,
        "source": {"kind": "benchmark"},
        "counts": {},
        "fill": {},
    }


def _wall(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    args.repeats = args.repeats or (3 if args.quick else 9)
    env = harness.banner("preblock")
    env["allocator"] = harness.keep_freed_memory()
    pool = paragraph_lengths()
    rows: list[dict] = []
    bench_packing(args, rows, pool)
    bench_validator(args, rows, pool)
    bench_pipeline(args, rows, pool)
    harness.write_json(__file__, {"env": env, "quick": args.quick, "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
