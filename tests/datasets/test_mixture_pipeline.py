"""Mixtures through ``Pipeline``: batches equal a reference, resume, checkpoints, baselines, and the
same batches (and interleave counts) on 1x1, 1x8 and 2 processes x 4 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiles import count_compiles
from corpora import random_docs, sliding_frames, write_docs
from meshes import mesh_of
from mixture_reference import least_consumed, stable_rows
from mp_harness import assemble, run_jobs

import meshbatch
from meshbatch import CausalLMDataset, Mixture, Pipeline, ShuffleSpec, TokenBalancedMixture
from meshbatch.arguments import as_key
from meshbatch.cache import TokenCache
from meshbatch.datasets import Rows
from meshbatch.datasets.mixtures import CountOverflowError, PositionLog, derive_keys
from meshbatch.kernels import causal_lm_batch
from meshbatch.pipeline.programs import plan_program

SEQ = 16
BATCH = 8
STEPS = 6
KEY = 5
EOS = 1
NAMES = ("a", "b", "c")
WEIGHTS = {"a": 0.5, "b": 0.25, "c": 0.25}


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """Three caches whose token ids say which cache they came from: ``1000 * (k + 1) + ...``."""
    root = tmp_path_factory.mktemp("mixture")
    rng = np.random.default_rng(0)
    return [
        write_docs(
            root / f"cache{k}", random_docs(rng, docs, (2, 999), (3, 60), offset=1000 * (k + 1), eos=EOS)
        )
        for k, docs in enumerate((40, 12, 6))
    ]


def children(paths, *, splice: bool = False, pool: bool = False) -> dict:
    """Causal windows of caches 0 and 1; cache 2 as causal windows or as splice frames, fetched or
    pooled on device (real tokens: their copy lengths)."""
    caches = [TokenCache.open(p) for p in paths]
    out = {
        "a": CausalLMDataset(caches[0], SEQ, shuffle=ShuffleSpec("full"), eos_id=EOS),
        "b": CausalLMDataset(caches[1], SEQ, shuffle=ShuffleSpec("none"), eos_id=EOS),
    }
    if splice:
        out["c"] = sliding_frames(caches[2], SEQ, 6, EOS, pool=pool)
    else:
        out["c"] = CausalLMDataset(caches[2], SEQ, shuffle=ShuffleSpec("full"), eos_id=EOS)
    return out


def report_of(pipeline, caches):
    def report():
        out = {f"spans{i}": c.counters.spans_requested for i, c in enumerate(caches)}
        state = pipeline.state_dict()
        for entry in state.get("datasets", []):
            out[f"tokens/{entry['spec']}"] = entry["token_offset"]
            out[f"rows/{entry['spec']}"] = entry["row_offset"]
        return out

    return report


def stable_pipeline(mesh, *, paths, compat=None, splice=False, pool=False, block_size=4):
    kids = children(paths, splice=splice, pool=pool)
    dataset = Mixture(kids, WEIGHTS, block_size=block_size, compat=compat)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=KEY)
    return pipeline, report_of(pipeline, [c.sources[0] for c in dataset.children if c.sources])


def balanced_pipeline(mesh, *, paths, splice=True, baseline="zero", names=NAMES, state=None):
    datasets = {name: child for name, child in children(paths, splice=splice).items() if name in names}
    dataset = TokenBalancedMixture(datasets, baseline=baseline)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=KEY, state=state)
    return pipeline, report_of(pipeline, [c.sources[0] for c in dataset.children if c.sources])


# -- references ------------------------------------------------------------------------------------


def flat_tokens(path) -> np.ndarray:
    cache = TokenCache.open(path)
    return np.concatenate(cache.read_rows(np.arange(cache.num_rows)))


def stable_reference(paths, steps: int, compat) -> list[np.ndarray]:
    """Tokens of steps ``0 .. steps - 1``: mixture rows from the Python-int reference, each
    child's example from the child's own plan under its derived key, tokens straight from the
    cache."""
    kids = children(paths)
    mixture_key, child_keys = derive_keys(as_key(KEY), list(kids))
    lengths = {name: child.num_examples for name, child in kids.items()}
    located = stable_rows(lengths, WEIGHTS, 4, mixture_key, range(steps * BATCH), compat)
    source, index, epoch = (np.array(x) for x in zip(*located, strict=True))
    out = np.zeros((steps * BATCH, SEQ), np.int32)
    for s, name in enumerate(NAMES):
        mine = source == s
        child = kids[name]
        rows = Rows(jnp.asarray(index[mine], jnp.uint32), jnp.asarray(epoch[mine], jnp.uint32))
        plan, _ = child.make(child_keys[name])[0].plan(rows)
        starts = np.asarray(plan.example).astype(np.int64) * SEQ
        out[mine] = flat_tokens(paths[s])[starts[:, None] + np.arange(SEQ)]
    return list(out.reshape(steps, BATCH, SEQ))


# -- the stable mixture ----------------------------------------------------------------------------


@pytest.mark.parametrize(("compat", "devices"), [(None, 8), ("levanter", 1)])
def test_stable_mixture_equals_reference(caches, compat, devices):
    pipeline, _ = stable_pipeline(mesh_of(devices), paths=caches, compat=compat)
    for step, want in enumerate(stable_reference(caches, STEPS, compat)):
        batch = pipeline.batch(step)
        np.testing.assert_array_equal(np.asarray(batch.tokens), want, err_msg=f"{step=}")
        causal = causal_lm_batch(jnp.asarray(want), eos_id=EOS, ignore_id=None)
        np.testing.assert_array_equal(np.asarray(batch.loss_mask), np.asarray(causal.loss_mask))
        np.testing.assert_array_equal(np.asarray(batch.segment_ids), np.asarray(causal.segment_ids))


def test_causal_and_splice_children_never_recompile(caches):
    """Causal windows and splice frames in one mixture: fetched splice frames equal pooled ones
    (a device-resident child beside fetched ones), and no step after the first compiles."""
    fetched, _ = stable_pipeline(mesh_of(8), paths=caches, splice=True)
    pooled, _ = stable_pipeline(mesh_of(8), paths=caches, splice=True, pool=True)
    assert len(fetched.dataset.sources) == 3 and len(pooled.dataset.sources) == 2
    for pipeline in (fetched, pooled):
        jax.block_until_ready(pipeline.batch(0))
    with count_compiles() as compiles:
        for step in range(1, 2 * STEPS):
            a, b = fetched.batch(step), pooled.batch(step)
            for name in ("tokens", "loss_mask", "segment_ids"):
                np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)))
    assert compiles == []


# -- the token-balanced interleave -----------------------------------------------------------------


def plan_steps(dataset, steps: int, state=None):
    """The dataset's plans of ``steps`` steps of BATCH rows (jitted, no pipeline) and the state."""
    device = dataset.make(as_key(KEY))[0]
    state = dataset.init_state() if state is None else state
    rows = Rows(jnp.arange(BATCH, dtype=jnp.uint32), jnp.zeros(BATCH, jnp.uint32))
    plans = []
    for _ in range(steps):
        made, state = plan_program(device, rows, state)
        plans.append(made)
    return plans, state


def balanced_reference(paths, steps: int):
    """Each row's (source, nth) from the heap reference over the children's real tokens."""
    dataset = TokenBalancedMixture(children(paths, splice=True))
    device = dataset.make(as_key(KEY))[0]
    table = []
    for c, child in enumerate(dataset.children):
        ahead = np.arange(steps * BATCH)
        position, epoch = ahead % child.num_examples, ahead // child.num_examples
        rows = Rows(jnp.asarray(position, jnp.uint32), jnp.asarray(epoch, jnp.uint32))
        plan, _ = device.children[c].plan(rows)
        table.append(np.asarray(device.children[c].real_tokens(plan)))
    salts = [int(s) for s in np.asarray(device.salts)]
    return least_consumed([0] * len(table), np.stack(table), salts)


@pytest.fixture(scope="module")
def balanced_run(caches):
    """A 1x8 run of 2 * STEPS steps, never stopped: each step's tokens and state_dict, and the
    position log of its first STEPS steps."""
    pipeline, _ = balanced_pipeline(mesh_of(8), paths=caches)
    log = PositionLog()
    tokens, states = [], []
    with pipeline.iterate_from(0) as stream:  # prefetch workers plan ahead, in step order
        for step in range(2 * STEPS):
            tokens.append(np.asarray(next(stream).tokens))
            states.append(pipeline.state_dict())
            if step < STEPS:
                log.update(step, states[-1])
    return tokens, states, log


def test_counts_follow_the_rule(caches, balanced_run, tmp_path):
    """The position log's rows per source equal the heap reference's step by step (the splice
    child counts its copy lengths, the causal ones seq_len); consumed tokens stay within one row
    of each other."""
    picks, _ = balanced_reference(caches, STEPS)
    _, states, log = balanced_run
    for step in range(STEPS):
        upto = picks[: (step + 1) * BATCH]
        for s, name in enumerate(NAMES):
            assert log.history[step][name]["rows"] == sum(1 for t, _ in upto if t == s)
    tokens = log.tokens()
    assert tokens["a"][-1] == SEQ * log.history[-1]["a"]["rows"]
    assert log.history[1]["c"]["tokens"] > 0 and log.history[1]["c"]["tokens"] % SEQ  # copy lengths
    per_step = np.array(list(tokens.values()))  # [sources, steps]
    assert (per_step.max(axis=0) - per_step.min(axis=0) <= SEQ).all()
    assert states[STEPS - 1]["step"] == STEPS and states[STEPS - 1]["interleave_version"] == 1
    step_metrics = PositionLog().update(0, states[0])
    assert step_metrics["data/a/rows"] + step_metrics["data/b/rows"] + step_metrics["data/c/rows"] == BATCH
    figure = log.plot(str(tmp_path / "consumed.png"))
    assert open(figure, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_resume_equals_uninterrupted(caches, balanced_run):
    """Must-show 3: save at step k, resume on another mesh (1x1): the next batches are identical
    to the uninterrupted 1x8 run's, and so is the state after them."""
    want, states, _ = balanced_run
    resumed, _ = balanced_pipeline(mesh_of(1), paths=caches, state=states[STEPS - 1])
    got = [np.asarray(resumed.batch(STEPS).tokens)]
    with count_compiles() as compiles:  # the carried state never recompiles the plan
        got += [np.asarray(resumed.batch(step).tokens) for step in range(STEPS + 1, 2 * STEPS)]
    assert compiles == []
    np.testing.assert_array_equal(np.stack(got), np.stack(want[STEPS:]))
    assert resumed.state_dict() == states[-1]


@pytest.fixture(scope="module")
def two_by_four(caches, tmp_path_factory) -> dict[str, list[dict]]:
    """The balanced (``2 * STEPS`` steps) and stable (``STEPS``) pipelines of this module over
    ``caches`` on 2 processes x 4 devices (one 8-device mesh), in one launch: factory -> results.
    Both two-process tests use it; ``make test`` (``--dist loadfile``) runs a module on one worker,
    so the launch is made once."""
    jobs = {"balanced_pipeline": 2 * STEPS, "stable_pipeline": STEPS}
    results = run_jobs(
        tmp_path_factory.mktemp("two_by_four"),
        processes=2,
        local_devices=4,
        mesh_shape="8",
        jobs=[(f"test_mixture_pipeline:{f}", {"paths": list(caches)}, steps) for f, steps in jobs.items()],
    )
    return dict(zip(jobs, results, strict=True))


@pytest.mark.slow
def test_balanced_equal_across_two_processes(caches, balanced_run, two_by_four):
    """Must-show 4: 2 processes x 4 devices give the 1x8 batches; each process reads only its own
    rows from each cache, and both hold the same counts as the 1x8 run after every step (no
    synchronisation between ranks)."""
    want, states, _ = balanced_run
    steps = 2 * STEPS
    results = two_by_four["balanced_pipeline"]
    for step in range(steps):
        np.testing.assert_array_equal(
            assemble(results, step=step, leaf="tokens", like=want[step]), want[step]
        )
    picks, _ = balanced_reference(caches, steps)
    for p, result in enumerate(results):
        final = {e["spec"]: e for e in states[-1]["datasets"]}
        for name in NAMES:
            assert int(result[f"report/rows/{name}"]) == final[name]["row_offset"]
            assert int(result[f"report/tokens/{name}"]) == final[name]["token_offset"]
        mine = [s for i, (s, _) in enumerate(picks) if (i % BATCH) // (BATCH // 2) == p]
        for s in range(3):  # one span per row of this process from cache s, none of the other's
            assert int(result[f"report/spans{s}"]) == mine.count(s)


@pytest.mark.slow
def test_stable_equal_across_two_processes(caches, two_by_four):
    """Must-show 4 for the stable mixture: 2 processes x 4 devices build the reference batches."""
    results = two_by_four["stable_pipeline"]
    for step, want in enumerate(stable_reference(caches, STEPS, None)):
        np.testing.assert_array_equal(assemble(results, step=step, leaf="tokens", like=want), want)


def test_unknown_specs_round_trip_and_missing_token_offsets_load(caches):
    pipeline, _ = balanced_pipeline(mesh_of(1), paths=caches)
    pipeline.batch(0)
    saved = pipeline.state_dict()
    retired = {"spec": "retired/v1", "token_offset": 12345, "row_offset": 7, "note": ["kept", 1]}
    saved["datasets"].append(retired)
    del saved["datasets"][0]["token_offset"]  # an older checkpoint: rows only
    pipeline.load_state_dict(saved)
    state = pipeline.dataset.load_state_dict(
        {k: v for k, v in saved.items() if k not in ("version", "step", "content")}
    )
    assert int(state.tokens.lo[0]) == 0 and int(state.tokens.hi[0]) == 0
    for step in range(1, 3):
        pipeline.batch(step)
    entries = pipeline.state_dict()["datasets"]
    assert entries[-1] == retired and list(entries[-1]) == list(retired)  # unchanged, key order too
    with pytest.raises(ValueError, match="spec 'a' appears twice"):
        pipeline.load_state_dict({**saved, "datasets": saved["datasets"] + [saved["datasets"][0]]})
    with pytest.raises(ValueError, match="row_offset of 'b' must be >= 0"):
        bad = [dict(e, row_offset=-1) if e["spec"] == "b" else e for e in saved["datasets"]]
        pipeline.load_state_dict({**saved, "datasets": bad})
    with pytest.raises(ValueError, match=r"unknown keys \['counts'\]"):
        pipeline.load_state_dict({**saved, "counts": {}})
    with pytest.raises(ValueError, match="interleave_version=2 is not 1"):
        pipeline.load_state_dict({**saved, "interleave_version": 2})


def test_baseline_seeding(caches):
    """A source added on resume: "zero" lets it take every row until it catches up (the seed's
    new-spec dominance); "min" and "mean" start it with the others: it takes its share at once."""
    kids = children(caches)
    two = TokenBalancedMixture({"a": kids["a"], "b": kids["b"]})
    _, state = plan_steps(two, STEPS)
    saved = two.state_dict(state)
    known = [e["token_offset"] for e in saved["datasets"]]
    behind = min(known) // SEQ  # rows c needs to catch up from 0
    assert behind >= 2 * BATCH
    for baseline in ("zero", "min", "mean"):
        three = TokenBalancedMixture(kids, baseline=baseline)
        start = three.load_state_dict(saved)
        assert int(start.tokens.lo[2]) == {"zero": 0, "min": min(known), "mean": sum(known) // 2}[baseline]
        plans, _ = plan_steps(three, 2, start)
        to_c = sum(int(np.sum(np.asarray(p.source) == 2)) for p in plans)
        if baseline == "zero":
            assert to_c == 2 * BATCH  # every row of both steps
        else:
            assert to_c <= 2 * BATCH // 3 + 2  # about its third


def test_mixture_arguments(caches):
    """Staged weights by step become rows through the batch schedule; bad children and stages
    are refused by name."""
    kids = children(caches)
    stages = [(0, WEIGHTS), (3, {"a": 0.0, "b": 1.0, "c": 1.0})]
    mixture = Mixture(kids, stages, block_size=4, batch_size=[(0, 8), (2, 4)])
    lengths = {name: child.num_examples for name, child in kids.items()}
    by_rows = [(0, WEIGHTS), (2 * 8 + 4, stages[1][1])]  # step 3 starts at row 2 * 8 + 1 * 4
    want = meshbatch.mixture_schedule(lengths, by_rows, block_size=4, key=0)
    for field in ("stage_start", "counts", "base_index"):
        np.testing.assert_array_equal(np.asarray(mixture.rows[field]), np.asarray(getattr(want, field)))
    with pytest.raises(ValueError, match="pass the pipeline's batch_size"):
        Mixture(kids, stages, block_size=4)
    with pytest.raises(ValueError, match="row 24, not a multiple of block_size=16"):
        Mixture(kids, stages, block_size=16, batch_size=8)
    with pytest.raises(ValueError, match="different seq_len"):
        Mixture({**kids, "d": CausalLMDataset(TokenCache.open(caches[0]), SEQ * 2)}, {**WEIGHTS, "d": 1.0})
    with pytest.raises(TypeError, match=r"datasets\['x'\] must be a meshbatch Dataset"):
        TokenBalancedMixture({"x": object()})
    with pytest.raises(ValueError, match=r"datasets\['x'\] carries state"):
        Mixture({"x": TokenBalancedMixture(kids)}, {"x": 1.0})
    with pytest.raises(ValueError, match="baseline='max' is not one of"):
        TokenBalancedMixture(kids, baseline="max")


def test_counts_that_would_pass_2_to_the_64_are_refused_not_wrapped(caches):
    mixture = TokenBalancedMixture(children(caches))
    device = mixture.make(as_key(KEY))[0]  # one compilation (plan_program) for both cases
    rows = Rows(jnp.arange(BATCH, dtype=jnp.uint32), jnp.zeros(BATCH, jnp.uint32))
    near = {"datasets": [{"spec": n, "row_offset": 0, "token_offset": 2**64 - 5} for n in NAMES]}
    before = mixture.load_state_dict(near)
    _, after = plan_program(device, rows, before)  # the program holds no check (no host callback)
    refused = r"step 0: the token-balanced count of specs \['a', 'b', 'c'\] \(of .*\) would pass 2\^64 - 1"
    with pytest.raises(CountOverflowError, match=refused):
        mixture.check_state(0, before, after)
    pipeline = Pipeline(
        mixture, mesh=mesh_of(8), batch_size=BATCH, key=KEY, state={"version": 1, "step": 0, **near}
    )
    with pytest.raises(CountOverflowError, match=refused):  # on the host, before the step is used
        pipeline.batch(0)
    with pytest.raises(ValueError, match=r"token_offset of 'a' must be <= 18446744073709551615"):
        mixture.load_state_dict({"datasets": [{"spec": "a", "row_offset": 0, "token_offset": 2**64}]})
    high = {"datasets": [{"spec": n, "row_offset": 0, "token_offset": 2**64 - 2**20} for n in NAMES]}
    state = mixture.load_state_dict(high)
    for _ in range(2):  # exact up to 2^64 - 1
        _, state = plan_program(device, rows, state)
    counts = [e["token_offset"] for e in mixture.state_dict(state)["datasets"]]
    assert sum(counts) == 3 * (2**64 - 2**20) + 2 * BATCH * SEQ
