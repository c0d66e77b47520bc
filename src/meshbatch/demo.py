"""``make demo``: the splice job end to end, on real text, on a virtual 8-device mesh.

1. Writes the documentation topics that ship with CPython (``pydoc_data.topics``: 79 documents,
   about 465K bytes, no download) to a JSONL file and builds a Levanter-format token cache with
   the byte-level tokenizer (resumable; a second run reuses it).
2. Selects the longest documents from the cache's offsets alone.
3. Streams spliced batches through the pipeline (coverage-balanced starts with edge weighting,
   low-discrepancy offset jitter, temperature balancing, a per-epoch shuffle) on 8 virtual CPU
   devices, with a progress bar, and reports throughput and the consumer's wait.
4. Prints a per-document coverage table and saves a picture: where each document's copies
   landed (start in the document x offset in the frame) and a few rendered frames.

    python -m meshbatch.demo [--out demo_out] [--epochs 2] [--batch-size 64] [--seq-len 1024]
"""

from __future__ import annotations

import os

# The demo's mesh: 8 virtual CPU devices unless the caller chose otherwise. Read when the CPU
# backend starts, which importing jax does not do.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import json
import logging
import pathlib
import time

import jax
import numpy as np
from tqdm import tqdm

from meshbatch import Pipeline, SpliceLMDataset, select_documents

from .cache import ByteTokenizer, TokenCache, build_cache
from .datasets.splice import coverage_counts, pairs_per_doc
from .kernels import lookup_rows

PAD, EOS = 0, ByteTokenizer.eos_id  # NUL never occurs in the text; EOS marks the splice point


def write_corpus(path: pathlib.Path) -> list[str]:
    """The pydoc topics as JSONL, one document per line, sorted by topic name; returns the names."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    with open(path, "w") as f:
        for name in names:
            f.write(json.dumps({"id": name, "text": topics[name]}) + "\n")
    return names


def coverage_table(schedule, names, selection, streamed_docs) -> list[dict]:
    rows_per_epoch = pairs_per_doc(schedule)
    table = []
    for d, (index, length) in enumerate(zip(selection.indices, selection.lengths, strict=True)):
        copies = coverage_counts(schedule, d)
        edge = max(1, int(length) // 20)
        table.append(
            {
                "doc": d,
                "topic": names[int(index)],
                "length": int(length),
                "rows_per_epoch": int(rows_per_epoch[d]),
                "rows_streamed": int((streamed_docs == d).sum()),
                "covered": float((copies > 0).mean()),
                "copies_min": int(copies.min()),
                "copies_mean": float(copies.mean()),
                "copies_max": int(copies.max()),
                "edge_vs_middle": float(
                    np.concatenate([copies[:edge], copies[-edge:]]).mean()
                    / max(copies[edge:-edge].mean(), 1e-9)
                ),
            }
        )
    return table


def draw(path: pathlib.Path, placements, coverage, frames, table) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = len(table)
    fig = plt.figure(figsize=(3.2 * docs, 9.5), constrained_layout=True)
    grid = fig.add_gridspec(3, docs, height_ratios=[1.2, 0.8, 1.0])
    doc, t, s = placements
    s_range = [int(s.min()), int(s.max()) + 1]
    for d, row in enumerate(table):
        mine = doc == d
        ax = fig.add_subplot(grid[0, d])
        ax.hist2d(t[mine], s[mine], bins=[40, s_range[1] - s_range[0]], range=[[0, row["length"]], s_range])
        ax.set_title(f"{row['topic']}\n{row['length']} tokens, {row['rows_streamed']} rows", fontsize=9)
        ax.set_xlabel("start t in document")
        ax = fig.add_subplot(grid[1, d])
        ax.plot(coverage[d], lw=0.6)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("token of the document")
        if d == 0:
            fig.axes[0].set_ylabel("offset s in frame")
            ax.set_ylabel("copies per epoch")
    ax = fig.add_subplot(grid[2, :])
    tokens, loss, names = frames
    # 0 filler, 1 EOS before the splice, 2 document token with a target, 3 last copied token
    kind = np.where(tokens == EOS, 1, np.where(loss == 1, 2, 0))
    kind = np.where((tokens != PAD) & (tokens != EOS) & (loss == 0), 3, kind)
    colors = matplotlib.colors.ListedColormap(["#dddddd", "#d62728", "#1f77b4", "#ff7f0e"])
    ax.imshow(kind, aspect="auto", cmap=colors, vmin=0, vmax=3, interpolation="nearest")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel(
        "frame position: grey filler, red EOS before the splice, blue trained token, orange last copy"
    )
    ax.set_title("rendered frames from the stream")
    fig.suptitle("meshbatch splice demo: where the documents landed", fontsize=12)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="meshbatch's splice job, end to end")
    parser.add_argument("--out", default="demo_out", help="directory for the cache, corpus and picture")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--num-docs", type=int, default=6)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices")
    names = write_corpus(out / "corpus.jsonl")
    build_cache(str(out / "cache"), [str(out / "corpus.jsonl")], if_exists="resume", progress=True)
    cache = TokenCache.open(str(out / "cache"))
    print(f"cache: {cache.num_rows} documents, {cache.num_tokens} tokens ({cache.dtype})")

    selection = select_documents(
        cache.doc_lengths(), num_docs=args.num_docs, min_doc_length=args.seq_len, doc_select_mode="longest"
    )
    print(f"selected ({selection.reason}): " + ", ".join(names[i] for i in selection.indices))

    dataset = SpliceLMDataset.from_cache(
        cache,
        selection.indices,
        seq_len=args.seq_len,
        content_length=args.seq_len * 5 // 8,  # room in front of each copy for the offset jitter
        content_start_mode="coverage_balanced",
        alpha=0.8,
        offset_jitter=16,
        jitter_mode="low_discrepancy",
        balance_mode="by_temperature",
        balance_tau=0.7,
        epoch_length=2048,
        shuffle_per_epoch=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    key = jax.random.key(0)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=args.batch_size, key=key)
    steps = args.epochs * dataset.num_examples // args.batch_size
    if steps < 2:
        parser.error(
            f"--epochs {args.epochs} x {dataset.num_examples} rows per epoch // --batch-size "
            f"{args.batch_size} gives {steps} steps; the demo needs at least 2"
        )
    mode = "fetched spans" if dataset.fetches else "device pool"
    print(
        f"streaming {steps} steps of {args.batch_size} x {args.seq_len} on mesh {dict(mesh.shape)}: "
        f"{dataset.num_examples} rows per epoch from a {mode}"
    )

    stream = pipeline.iterate_from(0)
    jax.block_until_ready(next(stream))  # compile outside the timed loop
    stream.reset_stats()
    docs, frames = [], None
    start = time.perf_counter()
    for _ in tqdm(range(1, steps), desc="batches", unit="batch"):
        batch = next(stream)
        jax.block_until_ready(batch)
        docs.append(np.asarray(batch.doc_idx))
        if frames is None:
            frames = (
                np.asarray(batch.tokens[:4]),
                np.asarray(batch.loss_mask[:4]),
                np.asarray(batch.doc_idx[:4]),
            )
    seconds = time.perf_counter() - start
    stats = stream.stats()
    stream.close()
    tokens = (steps - 1) * args.batch_size * args.seq_len
    print(
        f"throughput: {tokens / seconds / 1e6:.1f}M tokens/s, {(steps - 1) / seconds:.1f} batches/s; "
        f"consumer waited {stats['wait_mean_s'] * 1e3:.2f} ms per batch on average"
    )

    schedule = dataset.make(key)[0].schedule
    rows = np.arange(args.batch_size, steps * args.batch_size, dtype=np.int64)
    epoch, position = np.divmod(rows, dataset.num_examples)
    doc, t, s, _ = (
        np.asarray(x)
        for x in jax.jit(lookup_rows)(schedule, position.astype(np.uint32), epoch.astype(np.uint32))
    )
    streamed = np.concatenate(docs)
    if not np.array_equal(doc, streamed):
        raise AssertionError("the streamed doc_idx disagrees with the schedule's plan")

    table = coverage_table(schedule, names, selection, streamed)
    print(
        f"\n{'doc':>3} {'topic':<20} {'length':>7} {'rows/epoch':>10} {'streamed':>8} {'covered':>8} "
        f"{'copies min/mean/max':>20} {'edge/middle':>11}"
    )
    for row in table:
        copies = f"{row['copies_min']}/{row['copies_mean']:.1f}/{row['copies_max']}"
        print(
            f"{row['doc']:>3} {row['topic']:<20} {row['length']:>7} {row['rows_per_epoch']:>10} "
            f"{row['rows_streamed']:>8} {row['covered']:>8.1%} {copies:>20} {row['edge_vs_middle']:>11.2f}"
        )

    picture = out / "splice_demo.png"
    frame_names = [f"{table[int(d)]['topic']} (doc {int(d)})" for d in frames[2]]
    coverage = [coverage_counts(schedule, d) for d in range(len(table))]
    draw(picture, (doc, t, s), coverage, (frames[0], frames[1], frame_names), table)
    (out / "splice_demo.json").write_text(json.dumps({"table": table, "prefetch": stats}, indent=2) + "\n")
    print(f"\nwrote {picture} and {out / 'splice_demo.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
