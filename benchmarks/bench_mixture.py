"""Mixtures: least-consumed selection rows/s, and mixed-pipeline tokens/s against Levanter.

Selection. Each of ``sources`` sources has ``rows`` upcoming rows of random real-token counts
(1 .. 4096). The least-consumed rule picks ``rows`` rows:

* meshbatch: ``meshbatch.kernels.select_scan`` (one jitted ``lax.scan`` over the rows, 64-bit
  counts carried as two uint32 words), called on the ``[sources, rows]`` token table, blocked
  until ready;
* baseline: a heap-based Python generator as the seed's ``build_interleaved_dataset`` would write
  it (``heapq`` of ``(tokens, random tie-break, source)``, one ``next()`` per row, the row's token
  count read from a list), drawing the same number of rows.

Both run in this process, rotating for ``rounds`` rounds of ``repeats`` timed runs after a
warm-up (harness ``rotating_times``); the table gives each one's median and the ratio. The
meshbatch selection is checked equal to a heap that uses its own tie-break hash first.

    python benchmarks/bench_mixture.py [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from harness import banner, rotating_times, write_json

from meshbatch.kernels import Counts, select_scan, source_salts

MAX_ROW = 4096


def heap_generator(token_lists, token_counts, seed):
    """The seed's least-consumed generator: the least-consumed source's next row, forever."""
    rng = random.Random(seed)
    heap = [(count, rng.random(), s) for s, count in enumerate(token_counts)]
    heapq.heapify(heap)
    positions = [0] * len(token_lists)
    while True:
        count, _, s = heapq.heappop(heap)
        tokens = token_lists[s][positions[s]]
        positions[s] += 1
        yield s, tokens
        heapq.heappush(heap, (count + tokens, rng.random(), s))


def check_equal_to_heap(table: np.ndarray, salts: jax.Array) -> None:
    """The kernel's picks equal a heap keyed on (count, its tie hash)."""
    from meshbatch.kernels import tie_hash

    sources, rows = table.shape
    out = select_scan(
        Counts(jnp.zeros(sources, jnp.uint32), jnp.zeros(sources, jnp.uint32)), jnp.asarray(table), salts
    )
    hashes = np.asarray(salts)

    def h(s, count):
        return int(tie_hash(jnp.uint32(hashes[s]), jnp.uint32(count >> 32), jnp.uint32(count & 0xFFFFFFFF)))

    heap = [(0, h(s, 0), s) for s in range(sources)]
    heapq.heapify(heap)
    taken, picks = [0] * sources, []
    for _ in range(min(rows, 256)):
        count, _, s = heapq.heappop(heap)
        picks.append(s)
        count += int(table[s, taken[s]])
        taken[s] += 1
        heapq.heappush(heap, (count, h(s, count), s))
    assert np.asarray(out.source)[: len(picks)].tolist() == picks


def time_selection(rows: int, sources: int, *, rounds: int, repeats: int) -> dict[str, list[float]]:
    """Wall times of the jitted scan and of the heap generator selecting ``rows`` rows."""
    rng = np.random.default_rng(0)
    table = rng.integers(1, MAX_ROW + 1, (sources, rows)).astype(np.int32)
    salts = source_salts(jnp.uint32(0), sources)
    check_equal_to_heap(table, salts)
    device_table = jnp.asarray(table)
    zero = Counts(jnp.zeros(sources, jnp.uint32), jnp.zeros(sources, jnp.uint32))
    lists = table.tolist()

    def scan():
        jax.block_until_ready(select_scan(zero, device_table, salts))

    def heap():
        generator = heap_generator(lists, [0] * sources, seed=0)
        for _ in range(rows):
            next(generator)

    return rotating_times({"scan": scan, "heap": heap}, rounds=rounds, repeats=repeats)


def bench_selection(configs, *, rounds: int, repeats: int) -> list[dict]:
    results = []
    for rows, sources in configs:
        times = time_selection(rows, sources, rounds=rounds, repeats=repeats)
        scan_s, heap_s = statistics.median(times["scan"]), statistics.median(times["heap"])
        row = {
            "rows": rows,
            "sources": sources,
            "scan_rows_per_s": rows / scan_s,
            "heap_rows_per_s": rows / heap_s,
            "ratio": heap_s / scan_s,
        }
        print(
            f"| {rows} | {sources} | {row['heap_rows_per_s'] / 1e6:.2f} M/s | "
            f"{row['scan_rows_per_s'] / 1e6:.2f} M/s | **{row['ratio']:.1f}x** |"
        )
        results.append(row)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and configurations")
    args = parser.parse_args()
    env = banner("bench_mixture")
    configs = [(4096, 16)] if args.quick else [(4096, 16), (4096, 4), (4096, 64), (16384, 16)]
    rounds, repeats = (2, 3) if args.quick else (5, 5)
    print("\n## selection: least-consumed rule, rows/s (median)\n")
    print("| rows | sources | heap generator (Python) | jitted scan | ratio |\n|---:|---:|---:|---:|---:|")
    selection = bench_selection(configs, rounds=rounds, repeats=repeats)
    write_json(__file__, {"env": env, "quick": args.quick, "selection": selection})


if __name__ == "__main__":
    main()
