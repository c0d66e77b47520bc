"""Mixtures: least-consumed selection rows/s, and mixed-pipeline tokens/s against Levanter.

Selection. Each of ``sources`` sources has ``rows`` upcoming rows of random real-token counts
(1 .. 4096). The least-consumed rule picks ``rows`` rows:

* meshbatch: ``meshbatch.kernels.select_tournament`` (the pipeline's kernel: a winner tree over
  the sources, one leaf-to-root climb per row, all in one compiled loop), called two ways: as a
  program (``tournament_program``: the kernel inside a jitted function of arrays, as the pipeline
  runs it inside its jitted plan) and as a kernel call (``select_tournament(counts, ...)`` itself:
  its ``Counts`` and ``Selection`` are ``equinox.Module``s, which jax flattens and rebuilds in
  Python on every call, about 15 us a call that the pipeline never pays); ``select_merge`` (the
  picks as a parallel k-way merge: prefix sums, a threshold bisection and two single-array
  sorts; ``select_merge.py`` beside this script) and ``select_scan`` (the rule literally, one
  jitted ``lax.scan`` step per row, an argmin over every source: the tests' reference,
  ``tests/interleave_reference.py``), all with 64-bit counts as two uint32 words, called on the
  ``[rows, sources]`` token table (a column per source), blocked until ready;
* baseline: a heap-based Python generator as the seed's ``build_interleaved_dataset`` would write
  it (``heapq`` of ``(tokens, random tie-break, source)``, one ``next()`` per row, the row's token
  count read from a list), drawing the same number of rows.

The heap, the tournament (both ways) and the merge run in this process, rotating for ``rounds``
rounds of ``repeats`` timed runs after a warm-up (harness ``rotating_times``: each runs back to
back, its caches warm), then the scan alone (in one rotation with the scan at 256 sources the
heap ran 10x slower than alone); the table gives each one's median, its range (min .. max of the
rounds' medians) and the heap / tournament ratios. Then the heap and the tournament alternate
call by call (``--pairs`` pairs each way: each starts with the caches the other left, as a kernel
called once a step between other work would): the median of the pairs' ratios. Every meshbatch
selection is checked equal to a heap that uses its tie-break hash first.

Pipeline. ``--sources 3`` (the default): three token caches written by Levanter's
``SerialCacheWriter`` (Zipf token ids as in ``bench_pipeline.py``, 4 : 2 : 1 in size), mixed
0.5 / 0.3 / 0.2 in blocks of 2048 rows:

* Levanter: ``DataLoader`` over ``MixtureDataset`` of ``TokenSeqDataset`` windows of each cache
  (raw tokens), and over ``MixtureDataset`` of ``CausalLmDataset`` (``LmExample``s);
* meshbatch: ``Pipeline(Mixture({...: CausalLMDataset(cache, seq_len, shuffle=none)}))`` with
  ``compat="levanter"`` (its mixture key mapped to Levanter's; batches checked equal to
  Levanter's), the default mixture, and ``TokenBalancedMixture`` over the same children.

Each loader is warmed up (compiles, page cache), then a fresh iterator is timed for ``--steps``
batches, each ``block_until_ready``: tokens/s = steps * batch * seq_len / time; 1 and 8 virtual
CPU devices.

``--sources 64``: 64 caches of equal size, equal weights, 64 children; 8 devices only.

Floor (``--part floor``): the heap, the merge, one jitted single-array sort of ``rows`` uint32
words and an empty jitted call in one rotation at 64 and 256 sources: how much of the 10x
target's budget (the heap's time over 10) a sort-based order spends before any other work.

Climb (``--part climb``): the tournament's two forms of a step. Every level climbed at once from
the winner's key made a row ahead (the kernel up to ``SINGLE_CLIMB`` levels, 256 sources) against
the chunked climb (two levels an inner iteration, the key made in the step: the kernel above
``SINGLE_CLIMB``, and at 256 sources before this form), traced from the same function with
``SINGLE_CLIMB = 4`` patched, checked equal, then called in turn, one call each, for ``--calls``
calls (both see the same VM state): each side's median, and the median of the per-pair ratios. At
300 sources (9 levels) both sides are the chunked form: the ratio shows the method's noise.

Compiled (``--part compiled``): what the tournament's speed rests on, in XLA:CPU's output, checked
and reported at 3 to 1000 sources (a change of jax or of the kernel that breaks one shows here,
not as a failed test): every while loop of the kernel compiled into one native loop (none left in
the entry computation: ``SmallWhileLoopHoistingPass`` takes a loop whose body accesses under
``xla_cpu_small_while_loop_byte_threshold``, 1 KiB; a loop left there runs op by op through the
thunk runtime, 20 to 50x slower), and the entry computation's estimated flops under 1000, so the
call runs on the caller's thread (``cpu_client.cc``, ``cheap_computation_``; above, it is handed
to a worker thread, 50 to 150 us on a 2-core VM).

    python benchmarks/bench_mixture.py [--quick] [--part selection|floor|climb|compiled|pipeline|all]
                                        [--sources N] [--pairs N] [--calls N]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import functools
import gc
import heapq
import random
import re
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from harness import banner, rotating_times, write_json
from select_merge import select_merge

from meshbatch.kernels import Counts, select_tournament, source_salts

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from interleave_reference import select_scan
from reference import fmix32

MAX_ROW = 4096


def selection_arrays(select, hi, lo, row_tokens, salts):
    """``select``'s ``Selection`` as a tuple of arrays, for a jitted program of arrays."""
    picked = select(Counts(hi, lo), row_tokens, salts)
    return picked.source, picked.nth, picked.taken, picked.counts.hi, picked.counts.lo, picked.tokens


@jax.jit
def tournament_program(hi, lo, row_tokens, salts):
    """``select_tournament`` inside a jitted program of arrays, as the pipeline's plan runs it:
    ``Counts`` and ``Selection`` exist only while tracing."""
    return selection_arrays(select_tournament, hi, lo, row_tokens, salts)


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
    """Both kernels' picks equal a heap keyed on (count, their tie hash ``fmix32(count ^ salt)``),
    computed in Python ints (no eager jax call per row: their garbage slows what runs next)."""
    sources, rows = table.shape
    zero = Counts(jnp.zeros(sources, jnp.uint32), jnp.zeros(sources, jnp.uint32))
    hashes = [int(x) for x in np.asarray(salts)]

    def h(s, count):
        return fmix32((count & 0xFFFFFFFF) ^ hashes[s])

    heap = [(0, h(s, 0), s) for s in range(sources)]
    heapq.heapify(heap)
    taken, picks = [0] * sources, []
    for _ in range(rows):
        count, _, s = heapq.heappop(heap)
        picks.append(s)
        count += int(table[s, taken[s]])
        taken[s] += 1
        heapq.heappush(heap, (count, h(s, count), s))
    columns = jnp.asarray(table.T)  # the kernels' layout: a column per source
    for select in (select_tournament, select_merge, select_scan):
        assert np.asarray(select(zero, columns, salts).source).tolist() == picks
    in_program = tournament_program(zero.hi, zero.lo, columns, salts)
    assert np.asarray(in_program[0]).tolist() == picks


def time_selection(
    rows: int, sources: int, *, rounds: int, repeats: int, pairs: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall times of the jitted tournament (in a program and as a kernel call), merge and scan and
    of the heap generator selecting ``rows`` rows (per round: the median of its ``repeats`` runs),
    and the heap / tournament ratio of each of ``pairs`` alternating calls, each way."""
    rng = np.random.default_rng(0)
    table = rng.integers(1, MAX_ROW + 1, (sources, rows)).astype(np.int32)
    salts = source_salts(jnp.uint32(0), sources)
    check_equal_to_heap(table, salts)
    device_table = jnp.asarray(table.T)  # the kernels' layout: a column per source
    zero = Counts(jnp.zeros(sources, jnp.uint32), jnp.zeros(sources, jnp.uint32))
    lists = table.tolist()
    gc.collect()

    def kernel(select):
        return lambda: jax.block_until_ready(select(zero, device_table, salts))

    def heap():
        generator = heap_generator(lists, [0] * sources, seed=0)
        for _ in range(rows):
            next(generator)

    tournament = kernel(select_tournament)

    def program():
        return jax.block_until_ready(tournament_program(zero.hi, zero.lo, device_table, salts))

    runs = {"heap": heap, "program": program, "tournament": tournament, "merge": kernel(select_merge)}
    times = rotating_times(runs, rounds=rounds, repeats=repeats)
    # the scan runs on its own: after its op-by-op dispatch (over about 28 sources) XLA's worker
    # threads keep spinning for a while and would slow whatever ran next (the heap, in a rotation)
    times |= rotating_times({"scan": kernel(select_scan)}, rounds=rounds, repeats=repeats)
    alternating: dict[str, list[float]] = {"program": [], "tournament": []}
    for _ in range(pairs):
        for name, call in (("program", program), ("tournament", tournament)):
            start = time.perf_counter()
            heap()
            middle = time.perf_counter()
            call()
            alternating[name].append((middle - start) / (time.perf_counter() - middle))
    medians = {
        name: [statistics.median(values[r * repeats : (r + 1) * repeats]) for r in range(rounds)]
        for name, values in times.items()
    }
    return medians, alternating


def bench_selection(configs, *, rounds: int, repeats: int, pairs: int) -> list[dict]:
    results = []
    for rows, sources in configs:
        times, alternating = time_selection(rows, sources, rounds=rounds, repeats=repeats, pairs=pairs)
        median = {name: statistics.median(values) for name, values in times.items()}

        def cell(name, rows=rows, times=times, median=median):
            low, high = rows / max(times[name]), rows / min(times[name])
            return f"{rows / median[name] / 1e6:.2f} M/s ({low / 1e6:.2f} .. {high / 1e6:.2f})"

        def ratio(name, times=times, median=median):
            """The heap / ``name`` ratio of medians, and its range over the rounds."""
            ratios = [h / t for h, t in zip(times["heap"], times[name], strict=True)]
            return median["heap"] / median[name], [min(ratios), max(ratios)]

        (program, program_range), (call, call_range) = ratio("program"), ratio("tournament")
        quartiles = {name: np.percentile(r, [25, 50, 75]).tolist() for name, r in alternating.items()}
        row = {
            "rows": rows,
            "sources": sources,
            "seconds": times,
            "alternating_ratios": alternating,
            **{f"{name}_rows_per_s": rows / median[name] for name in median},
            "ratio": program,
            "ratio_range": program_range,
            "kernel_call_ratio": call,
            "kernel_call_ratio_range": call_range,
            "alternating_ratio_quartiles": quartiles,
        }

        def spread(q):
            return f"{q[1]:.1f}x ({q[0]:.1f} .. {q[2]:.1f})"

        print(
            f"| {rows} | {sources} | {cell('heap')} | {cell('program')} | {cell('tournament')} | "
            f"{cell('merge')} | {cell('scan')} | **{program:.1f}x** ({program_range[0]:.1f} .. "
            f"{program_range[1]:.1f}) | {call:.1f}x ({call_range[0]:.1f} .. {call_range[1]:.1f}) | "
            f"{spread(quartiles['program'])} | {spread(quartiles['tournament'])} | "
            f"{median['heap'] / median['merge']:.1f}x | {median['heap'] / median['scan']:.2f}x |"
        )
        results.append(row)
    return results


def floor_runs(rows: int, sources: int) -> dict:
    """The heap, the merge, one jitted single-array sort of ``rows`` words, an empty jitted call."""
    rng = np.random.default_rng(0)
    table = rng.integers(1, MAX_ROW + 1, (sources, rows)).astype(np.int32)
    device_table, salts = jnp.asarray(table.T), source_salts(jnp.uint32(0), sources)
    zero = Counts(jnp.zeros(sources, jnp.uint32), jnp.zeros(sources, jnp.uint32))
    words = jnp.asarray(rng.integers(0, 2**32, rows, dtype=np.uint64).astype(np.uint32))
    lists = table.tolist()
    empty, sort = jax.jit(lambda x: x[0]), jax.jit(jax.lax.sort)
    unstable = jax.jit(functools.partial(jax.lax.sort, is_stable=False))
    place = jnp.arange(rows, dtype=jnp.uint32)
    bits = (rows - 1).bit_length()

    def two(words, stable):
        # two dependent sorts of unique words, as ``select_merge.two_pass_order`` runs them
        first = jax.lax.sort(((words >> bits) << bits) | place, is_stable=stable) & ((1 << bits) - 1)
        return jax.lax.sort((words[first] << bits) | place, is_stable=stable)

    two_stable = jax.jit(functools.partial(two, stable=True))
    two_unstable = jax.jit(functools.partial(two, stable=False))

    def heap():
        generator = heap_generator(lists, [0] * sources, seed=0)
        for _ in range(rows):
            next(generator)

    return {
        "heap": heap,
        "merge": lambda: jax.block_until_ready(select_merge(zero, device_table, salts)),
        "sort": lambda: jax.block_until_ready(sort(words)),
        "sort_unstable": lambda: jax.block_until_ready(unstable(words)),
        "two_sorts": lambda: jax.block_until_ready(two_stable(words)),
        "two_sorts_unstable": lambda: jax.block_until_ready(two_unstable(words)),
        "call": lambda: jax.block_until_ready(empty(words)),
    }


def bench_floor(configs, *, rounds: int, repeats: int) -> list[dict]:
    """What bounds the merge on this backend, in one rotation with the heap: an empty jitted
    call, and one jitted single-array sort of ``rows`` uint32 words (the least work an exact
    order by a sort takes: ``select_merge`` sorts its picks twice). ``10x budget`` is the heap's
    time over 10: the time the issue's target leaves the whole selection."""
    results = []
    for rows, sources in configs:
        times = rotating_times(floor_runs(rows, sources), rounds=rounds, repeats=repeats)
        median = {name: statistics.median(values) for name, values in times.items()}
        budget = median["heap"] / 10
        row = {"rows": rows, "sources": sources, "seconds": times, "budget": budget}
        row["floor_share"] = (median["sort"] + median["call"]) / budget
        row["floor_share_unstable"] = (median["sort_unstable"] + median["call"]) / budget
        us = {name: f"{value * 1e6:.0f}" for name, value in median.items()}
        low = {name: f"{min(values) * 1e6:.0f}" for name, values in times.items()}
        print(
            f"| {rows} | {sources} | {us['heap']} | {budget * 1e6:.0f} | {us['merge']} | "
            f"{us['sort']} (min {low['sort']}) | {us['sort_unstable']} (min {low['sort_unstable']}) | "
            f"{us['two_sorts']} / {us['two_sorts_unstable']} | {us['call']} | "
            f"{row['floor_share']:.0%} / {row['floor_share_unstable']:.0%} |"
        )
        results.append(row)
    return results


def climb_program(single_climb: int, sources: int, rows: int):
    """``select_tournament`` compiled with ``interleave_tree.SINGLE_CLIMB = single_climb`` (read at
    trace time: the unjitted function is traced here, so no cached trace of the other is reused)."""
    from meshbatch.kernels.mixtures import interleave_tree

    program = functools.partial(selection_arrays, select_tournament.__wrapped__)
    words = jax.ShapeDtypeStruct((sources,), jnp.uint32)
    table = jax.ShapeDtypeStruct((rows, sources), jnp.int32)
    saved, interleave_tree.SINGLE_CLIMB = interleave_tree.SINGLE_CLIMB, single_climb
    try:
        compiled = jax.jit(program).lower(words, words, table, words).compile()
        return compiled, interleave_tree.tree_levels(sources)
    finally:
        interleave_tree.SINGLE_CLIMB = saved


def bench_climb(sizes, *, rows: int, calls: int) -> list[dict]:
    """The one-climb step (key made ahead) against the chunked one, call by call (see the module
    docstring)."""
    from meshbatch.kernels.mixtures.interleave_tree import SINGLE_CLIMB

    results = []
    for sources in sizes:
        table = jnp.asarray(np.random.default_rng(0).integers(1, MAX_ROW + 1, (rows, sources)), jnp.int32)
        salts, zero = source_salts(jnp.uint32(0), sources), jnp.zeros(sources, jnp.uint32)
        chunked, chunked_levels = climb_program(4, sources, rows)
        at_once, levels = climb_program(SINGLE_CLIMB, sources, rows)
        for a, b in zip(chunked(zero, zero, table, salts), at_once(zero, zero, table, salts), strict=True):
            np.testing.assert_array_equal(a, b)
        times: dict[str, list[float]] = {"chunked": [], "at_once": []}
        sides = (("chunked", chunked), ("at_once", at_once))
        for i in range(calls + 2):  # two warm-up calls each
            for name, program in sides if i % 2 == 0 else sides[::-1]:
                start = time.perf_counter()
                jax.block_until_ready(program(zero, zero, table, salts))
                if i >= 2:
                    times[name].append(time.perf_counter() - start)
        ratio = statistics.median(a / b for a, b in zip(times["chunked"], times["at_once"], strict=True))
        median = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        print(
            f"| {rows} | {sources} | {chunked_levels} / {levels} | {median['chunked']:.0f} | "
            f"{median['at_once']:.0f} | {ratio:.2f}x |"
        )
        results.append({"rows": rows, "sources": sources, "levels": [chunked_levels, levels],
                        "seconds": times, "ratio": ratio})  # fmt: skip
    return results


def check_compiled(sizes) -> list[dict]:
    """The tournament as XLA:CPU compiled it (see the module docstring): its while loops all native
    and its flops estimate under 1000, at each number of sources; reports, does not stop."""
    results = []
    for sources in sizes:
        zero = Counts(jnp.zeros(sources, jnp.uint32), jnp.zeros(sources, jnp.uint32))
        salts = source_salts(jnp.uint32(0), sources)
        text = select_tournament.lower(zero, jnp.zeros((64, sources), jnp.int32), salts).compile().as_text()
        entry = text[text.index("ENTRY") :]
        entry = entry[: entry.index("\n}")]
        native = " while(" not in entry and len(re.findall(r"xla_cpu_small_call", text)) >= 3
        compiled = select_tournament.lower(zero, jnp.zeros((512, sources), jnp.int32), salts).compile()
        cost = compiled.cost_analysis()
        flops = (cost[0] if isinstance(cost, list) else cost)["flops"]  # older jax: a list of one dict
        ok = native and flops < 1000
        print(f"| {sources} | {'yes' if native else 'NO'} | {flops:.0f} | {'ok' if ok else 'FAILS'} |")
        results.append({"sources": sources, "native_loops": native, "flops": flops, "ok": ok})
    return results


WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
SIZES = {"web": 4, "code": 2, "math": 1}


def mixture_config(sources: int) -> tuple[dict[str, float], dict[str, int]]:
    """``(weights, sizes)``: the three-cache mixture, or ``sources`` equal ones."""
    if sources == 3:
        return WEIGHTS, SIZES
    names = [f"s{i:03d}" for i in range(sources)]
    return dict.fromkeys(names, 1.0 / sources), dict.fromkeys(names, 1)


def write_caches(root: str, tokens: int, sizes: dict[str, int]) -> dict[str, str]:
    """Levanter caches of ``tokens * sizes[name] / sum(sizes)`` Zipf tokens each."""
    from bench_pipeline import write_cache

    paths = {}
    for name, share in sizes.items():
        paths[name] = os.path.join(root, name)
        write_cache(paths[name], tokens * share // sum(sizes.values()) + 8 * 4096)
    return paths


def sustained(make_iterator, steps: int, warmup: int) -> float:
    """Seconds for ``steps`` batches from a fresh iterator (after a separate warm-up one, from
    step 0; ``make_iterator(start)`` gives the stream from step ``start``: a stateful pipeline
    cannot restart at 0 once it has moved on)."""
    warm = make_iterator(0)
    for _ in range(warmup):
        jax.block_until_ready(next(warm))
    if hasattr(warm, "close"):
        warm.close()
    stream = make_iterator(warmup)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(stream))
    seconds = time.perf_counter() - start
    if hasattr(stream, "close"):
        stream.close()
    return seconds


def levanter_mixture(paths, weights, seq_len, batch, mesh, key, *, lm_examples: bool, block_size: int):
    import haliax as hax
    from levanter.data.loader import DataLoader
    from levanter.data.mixture import MixtureDataset
    from levanter.data.text import CausalLmDataset, TokenSeqDataset
    from levanter.store.cache import TreeCache

    exemplar = {"input_ids": np.zeros(0, np.int32)}
    children = {}
    for name, path in paths.items():
        child = TokenSeqDataset(TreeCache.load(path, exemplar), seq_len)
        if lm_examples:
            child = CausalLmDataset(child, hax.Axis("position", seq_len))
        children[name] = child
    mixture = MixtureDataset(children, weights, block_size, key=key)

    def make(start=0):
        with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
            loader = DataLoader(mixture, batch, mesh=mesh, axis_resources={"batch": "data"})
            return iter(loader.iter_from_step(start)) if start else iter(loader)

    return make


def meshbatch_pipelines(paths, weights, seq_len, batch, mesh, key, *, block_size: int) -> dict:
    from meshbatch import CausalLMDataset, Mixture, Pipeline, ShuffleSpec, TokenBalancedMixture
    from meshbatch.cache import TokenCache

    class LevanterKeyed(Mixture):
        """The mixture key is the pipeline's key, as Levanter's MixtureDataset takes it."""

        def derive_keys(self, key):
            return key, dict.fromkeys(self.names, key)

    def children():
        return {
            name: CausalLMDataset(TokenCache.open(path), seq_len, shuffle=ShuffleSpec("none"))
            for name, path in paths.items()
        }

    datasets = {
        "meshbatch Mixture, compat=levanter": LevanterKeyed(
            children(), weights, block_size=block_size, compat="levanter"
        ),
        "meshbatch Mixture, default": Mixture(children(), weights, block_size=block_size),
        "meshbatch TokenBalancedMixture": TokenBalancedMixture(children()),
    }
    return {label: Pipeline(d, mesh=mesh, batch_size=batch, key=key) for label, d in datasets.items()}


def bench_pipeline(args) -> list[dict]:
    steps, warmup = (20, 3) if args.quick else (100, 5)
    seq_len, batch, block_size = args.seq_len, args.batch, 2048
    tokens = (steps + warmup + 4) * batch * seq_len * 2
    key = jax.random.PRNGKey(0)
    weights, sizes = mixture_config(args.sources)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_caches(tmp, tokens, sizes)
        print(
            f"\n## pipeline: {len(paths)} caches, {tokens / 1e6:.0f}M tokens, seq_len={seq_len}, "
            f"batch={batch}\n"
        )
        print("| devices | loader | tokens/s | vs Levanter (tokens) | vs Levanter (LmExample) |")
        print("|---:|---|---:|---:|---:|")
        per_run = steps * batch * seq_len
        for devices in (1, 8) if args.sources == 3 else (8,):
            mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
            results = {}
            for label, lm in (
                ("Levanter MixtureDataset (tokens)", False),
                ("Levanter MixtureDataset -> LmExample", True),
            ):
                make = levanter_mixture(
                    paths, weights, seq_len, batch, mesh, key, lm_examples=lm, block_size=block_size
                )
                results[label] = sustained(make, steps, warmup)
            check = levanter_mixture(
                paths, weights, seq_len, batch, mesh, key, lm_examples=False, block_size=block_size
            )()
            expected = [np.asarray(next(check)) for _ in range(3)]
            for label, pipeline in meshbatch_pipelines(
                paths, weights, seq_len, batch, mesh, key, block_size=block_size
            ).items():
                if "levanter" in label:
                    for step, want in enumerate(expected):
                        np.testing.assert_array_equal(np.asarray(pipeline.batch(step).tokens), want)
                results[label] = sustained(lambda start, p=pipeline: p.iterate_from(start), steps, warmup)
            base, lm_base = (
                results["Levanter MixtureDataset (tokens)"],
                results["Levanter MixtureDataset -> LmExample"],
            )
            for label, seconds in results.items():
                ratios = f"{base / seconds:.1f}x | {lm_base / seconds:.1f}x"
                print(f"| {devices} | {label} | {per_run / seconds:.3e} | {ratios} |")
                rows.append(
                    {
                        "sources": len(paths),
                        "devices": devices,
                        "loader": label,
                        "seconds": seconds,
                        "tokens_per_s": per_run / seconds,
                    }
                )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, configurations and steps")
    parts = ("selection", "floor", "climb", "compiled", "pipeline", "all")
    parser.add_argument("--part", choices=parts, default="all")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=100, help="selection: alternating heap/tournament calls")
    parser.add_argument("--sources", type=int, default=3, help="pipeline: 3 (4:2:1) or N equal sources")
    parser.add_argument("--calls", type=int, default=1500, help="climb: calls of each side, in turn")
    args = parser.parse_args()
    env = banner("bench_mixture")
    out = {"env": env, "args": vars(args)}
    if args.part in ("selection", "all"):
        configs = [(4096, 64)] if args.quick else [(4096, 4), (4096, 16), (4096, 64), (4096, 256)]
        rounds, repeats = (2, 3) if args.quick else (7, 5)
        print("\n## selection: least-consumed rule, rows/s (median of rounds; range)\n")
        print(
            "| rows | sources | heap generator (Python) | tournament, in a program | tournament, "
            "kernel call | jitted merge | jitted scan | heap / tournament in a program (rounds) "
            "| heap / kernel call (rounds) | alternating calls: heap / program (quartiles) "
            "| alternating: heap / kernel call | heap / merge | heap / scan |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        )
        pairs = 20 if args.quick else args.pairs
        out["selection"] = bench_selection(configs, rounds=rounds, repeats=repeats, pairs=pairs)
    if args.part == "floor":
        configs = [(4096, 64), (4096, 256)]
        rounds, repeats = (2, 5) if args.quick else (7, 10)
        print("\n## floor: microseconds, medians of all runs (sort: also its minimum)\n")
        print(
            "| rows | sources | heap | 10x budget | merge | one sort of `rows` words (stable) "
            "| unstable | two dependent sorts, stable / unstable | empty call "
            "| sort + call / budget (stable / unstable) |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        )
        out["floor"] = bench_floor(configs, rounds=rounds, repeats=repeats)
    if args.part == "climb":
        print("\n## climb: microseconds, medians of alternating calls; ratio: median of chunked / at once\n")
        print("| rows | sources | levels (chunked / at once) | chunked | at once | ratio |")
        print("|---:|---:|---:|---:|---:|---:|")
        sizes = [64, 256] if args.quick else [32, 64, 100, 128, 256, 300]
        out["climb"] = bench_climb(sizes, rows=4096, calls=200 if args.quick else args.calls)
    if args.part == "compiled":
        print("\n## compiled: the tournament's loops native, its flops estimate under 1000\n")
        print("| sources | every loop native | flops estimate | |\n|---:|---|---:|---|")
        out["compiled"] = check_compiled([3, 64, 128, 256, 257, 1000])
    if args.part in ("pipeline", "all"):
        out["pipeline"] = bench_pipeline(args)
    # the floor and the climb go beside the selection's figures, never over them (``write_json``
    # keeps the runs RESULTS.md cites: ``selection_run1`` .. and the pipeline's)
    side = {"floor": "_floor.py", "climb": "_climb.py", "compiled": "_compiled.py"}.get(args.part)
    write_json(__file__.replace(".py", side) if side else __file__, out)


if __name__ == "__main__":
    main()
