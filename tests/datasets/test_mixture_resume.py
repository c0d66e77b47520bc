"""Token-balanced resume (issue 18, must-show 3): the seed's bare checkpoint JSON, a resume at step
1000 that plans only the steps it takes, and a resume with one source removed and one added
following each of the seed's rules."""

import numpy as np
import pytest
from meshes import mesh_of
from test_mixture_pipeline import BATCH, KEY, SEQ, STEPS, balanced_pipeline, caches, children

from meshbatch import Pipeline, TokenBalancedMixture

__all__ = ["caches"]  # the module fixture, shared


def tokens_of(pipeline, steps) -> np.ndarray:
    return np.stack([np.asarray(pipeline.batch(step).tokens) for step in steps])


@pytest.fixture(scope="module")
def saved_run(caches):
    """A run over a, b, c: its ``state_dict()`` after STEPS steps and its next two batches."""
    run, _ = balanced_pipeline(mesh_of(1), paths=caches)
    for step in range(STEPS):
        run.batch(step)
    return run.state_dict(), tokens_of(run, range(STEPS, STEPS + 2))


def test_the_seeds_bare_json_resumes_at_the_step_given(caches, saved_run):
    """``{"datasets": [...]}`` (no version, no step) loads with the step passed beside it, and is
    refused by name without one."""
    saved, want = saved_run
    bare = {"datasets": saved["datasets"]}
    resumed, _ = balanced_pipeline(mesh_of(1), paths=caches)
    resumed.load_state_dict(bare, step=STEPS)
    np.testing.assert_array_equal(tokens_of(resumed, range(STEPS, STEPS + 2)), want)
    with resumed.iterate_from(STEPS, state=bare) as stream:
        np.testing.assert_array_equal(np.stack([np.asarray(next(stream).tokens) for _ in range(2)]), want)
    with pytest.raises(ValueError, match=r"the state has no 'step'.*load_state_dict\(state, step=k\)"):
        resumed.load_state_dict(bare)
    with pytest.raises(ValueError, match="the state has no 'step'"):
        balanced_pipeline(mesh_of(1), paths=caches, state=bare)
    with pytest.raises(ValueError, match="the state has no 'step'"):
        resumed.iterate_from(state=bare)
    with pytest.raises(ValueError, match=f"step=3 differs from the state's step={STEPS}"):
        resumed.load_state_dict(saved, step=3)
    with pytest.raises(ValueError, match="'step' but no 'version'"):
        resumed.load_state_dict({"step": 4, **bare})
    resumed.load_state_dict(saved, step=STEPS)  # both, agreeing


def test_resume_at_step_1000_plans_only_what_it_takes(caches):
    """A resume at step 1000 from ``state_dict()`` plans the two steps it takes, as one at step 1
    does (the replay it replaces plans all 1002); its batches equal the unbroken run's."""
    run, _ = balanced_pipeline(mesh_of(1), paths=caches)
    run.batch(0)
    at_1 = run.state_dict()
    run.batch(999)  # the unbroken stream's plans of steps 1..999, in order
    at_1000 = run.state_dict()
    assert (at_1["step"], at_1000["step"]) == (1, 1000)
    want = tokens_of(run, (1000, 1001))
    assert run._planner.planned == 1002
    resumed, _ = balanced_pipeline(mesh_of(1), paths=caches)
    planned = []
    for state in (at_1, at_1000):
        resumed.load_state_dict(state)
        before = resumed._planner.planned
        got = tokens_of(resumed, range(state["step"], state["step"] + 2))
        planned.append(resumed._planner.planned - before)
    np.testing.assert_array_equal(got, want)
    assert resumed.state_dict() == run.state_dict()
    assert planned == [2, 2]


def changed_sources(caches, saved_run, baseline: str):
    """The run over a, b, c saved as the seed's bare JSON; a mixture over a, c and a new spec d
    (b removed, d added) with ``baseline``, resumed from it."""
    bare = {"datasets": saved_run[0]["datasets"]}
    kids = children(caches, splice=True)
    mixture = TokenBalancedMixture({"a": kids["a"], "c": kids["c"], "d": kids["b"]}, baseline=baseline)
    resumed = Pipeline(mixture, mesh=mesh_of(1), batch_size=BATCH, key=KEY)
    resumed.load_state_dict(bare, step=STEPS)
    return {e["spec"]: e for e in bare["datasets"]}, resumed


def test_a_removed_source_is_kept_and_written_back(caches, saved_run):
    """The seed's rule "unknown specs in a checkpoint are preserved": b, no longer configured,
    is written back unchanged (key order too) after more steps; the kept sources go on from their
    offsets."""
    saved, resumed = changed_sources(caches, saved_run, "zero")
    for step in range(STEPS, STEPS + 3):
        resumed.batch(step)
    entries = {e["spec"]: e for e in resumed.state_dict()["datasets"]}
    assert list(entries) == ["a", "c", "d", "b"]
    assert entries["b"] == saved["b"] and list(entries["b"]) == list(saved["b"])
    for spec in ("a", "c"):
        assert entries[spec]["row_offset"] >= saved[spec]["row_offset"]
        assert entries[spec]["token_offset"] >= saved[spec]["token_offset"]


@pytest.mark.parametrize("baseline", ["zero", "min", "mean"])
def test_an_added_source_starts_at_the_baseline(caches, saved_run, baseline):
    """The seed's "new specs start at 0" (``zero``: d then takes every row until it catches up)
    and its planned "seed new specs at a baseline" (``min`` / ``mean`` of the configured specs the
    checkpoint holds: d joins the rotation at once). d starts at its row 0."""
    saved, resumed = changed_sources(caches, saved_run, baseline)
    held = [saved["a"]["token_offset"], saved["c"]["token_offset"]]
    assert min(held) != sum(held) // 2 and min(held) >= BATCH * SEQ  # the rules differ here
    start = {e["spec"]: e for e in resumed.state_dict()["datasets"]}["d"]
    baselines = {"zero": 0, "min": min(held), "mean": sum(held) // 2}
    assert start == {"spec": "d", "row_offset": 0, "token_offset": baselines[baseline]}
    resumed.batch(STEPS)
    taken = {e["spec"]: e for e in resumed.state_dict()["datasets"]}["d"]["row_offset"]
    if baseline == "zero":
        assert taken == BATCH  # far behind: every row of the step
    else:
        assert 0 < taken < BATCH  # shares the step with a and c
