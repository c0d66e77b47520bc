"""meshbatch bench: the JSON of every kernel family and the pipeline step, recompiles reported,
the CI gates."""

import json
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

from meshbatch.bench import ALL, TINY, call_times, count_compiles, measure
from meshbatch.bench.gates import assert_no_recompiles, assert_no_regression
from meshbatch.bench.report import checkout_root, write_report
from meshbatch.cli import main

RESULT_KEYS = {
    "name",
    "family",
    "config",
    "trace_s",
    "lower_s",
    "compile_s",
    "run",
    "device_run",
    "dispatch",
    "recompiles",
    "recompiles_by_variant",
    "cost",
    "memory",
    "bandwidth_fraction",
}
RUN_KEYS = {"median_s", "p10_s", "p90_s", "min_s", "max_s", "mean_s", "calls", "timing"}
FAMILIES = {
    "permutations",
    "era and block shuffles",
    "causal build",
    "splice frames",
    "mixture selection",
    "preblocked packing",
    "MLM masking",
    "pipeline step",
}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """``meshbatch bench --all --tiny`` in a fresh process: a worker that already compiled a
    pipeline of these shapes (another test module) would trace nothing for its first step.
    Returns the JSON it wrote, its path and what it printed."""
    out = tmp_path_factory.mktemp("bench")
    command = [sys.executable, "-m", "meshbatch", "bench", "--all", "--tiny", "--repeats", "20"]
    command += ["--dispatch-calls", "10", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    (path,) = out.glob("bench-*.json")
    return json.loads(path.read_text()), path, done.stdout


@pytest.fixture(scope="module")
def report(bench_run):
    return bench_run[0]


def test_bench_all_writes_every_family_with_split_times_distributions_recompiles_and_bytes(report):
    env = report["environment"]
    assert env["jax"] == jax.__version__ and env["jaxlib"] and env["device_kind"] and env["devices"] == 8
    assert env["timing"] == "wall"  # the tests run on CPU devices: no device clock
    assert report["shapes"]["rows"] == TINY.rows and report["shapes"]["repeats"] == 20
    assert report["copy_bandwidth_bytes_per_s"] > 0
    names = [r["name"] for r in report["results"]]
    assert names == list(ALL)
    assert {r["family"] for r in report["results"]} == FAMILIES
    for r in report["results"]:
        assert RESULT_KEYS <= set(r), (r["name"], RESULT_KEYS - set(r))
        assert set(r["run"]) == RUN_KEYS and r["run"]["calls"] >= 20, r["name"]
        assert 0 < r["run"]["p10_s"] <= r["run"]["median_s"] <= r["run"]["p90_s"], r["name"]
        assert r["trace_s"] > 0 and r["lower_s"] > 0 and r["compile_s"] > 0, r["name"]
        assert r["dispatch"]["calls_per_s"] > 0, r["name"]
        # a new step and a new key: the same program (the pipeline step counts steps 1..repeats)
        steps = "steps 1-20" if r["name"] == "pipeline_step" else "step 1"
        assert r["recompiles"] == 0 and set(r["recompiles_by_variant"]) >= {steps, "key 1"}, r
        assert r["recompiles_by_variant"][steps] == r["recompiles_by_variant"]["key 1"] == 0, r
        assert r["cost"]["bytes_accessed"] > 0 and r["memory"]["output_bytes"] > 0, r["name"]
        assert r["device_run"] is None
        if r["name"] != "pipeline_step":
            assert 0 < r["bandwidth_fraction"] and 0 < r["output_bandwidth_fraction"], r["name"]
    step = report["results"][-1]
    assert step["first_step_compiles"] >= 1 and step["bytes_read_per_step"] > 0
    assert step["config"]["devices"] == 8 and {"plan", "fetch", "build"} <= set(step["phases_median_s"])


TABLE_HEAD = (
    "| benchmark | trace ms | lower ms | compile ms | run p10 / median / p90 ms | dispatch /s | recompiles "
    "| bytes accessed | memory (arg+out+temp) | of copy bw (accessed / output) |"
)


def test_bench_all_prints_the_table_of_what_it_wrote(bench_run):
    report, path, stdout = bench_run
    lines = stdout.splitlines()
    assert TABLE_HEAD in lines and lines[lines.index(TABLE_HEAD) + 1] == "|" + "---|" * 10
    rows = [line for line in lines if line.startswith("| ") and line != TABLE_HEAD]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == list(ALL)
    for row, r in zip(rows, report["results"], strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 10 and cells[6] == str(r["recompiles"]), row
        assert float(cells[1]) == pytest.approx(r["trace_s"] * 1e3, abs=1e-3), row
    env = report["environment"]
    assert f"jax {env['jax']}, jaxlib {env['jaxlib']}" in stdout and f"timing: {env['timing']}" in stdout
    assert lines[-1] == f"wrote {path}"


class Stepped(eqx.Module):
    """A step counter kept as a static field: a new step is a new program (the classic retrace)."""

    x: jax.Array
    step: int = eqx.field(static=True)


def retracing(m: Stepped):
    return m.x * m.step


def test_a_retracing_function_is_reported_as_recompiling():
    x = jnp.arange(8, dtype=jnp.int32)
    m = measure(
        retracing,
        (Stepped(x, 0),),
        name="retracing",
        repeats=20,
        dispatch_calls=2,
        variants=[("step 1", (Stepped(x, 1),)), ("step 2", (Stepped(x, 2),)), ("step 0", (Stepped(x, 0),))],
    )
    # a new step compiles (or reads back from the persistent compilation cache) one program
    assert m.recompiles_by_variant == {"step 1": 1, "step 2": 1, "step 0": 0}
    assert m.recompiles == 2
    # a program already compiled is no recompile: the gate sees step 3's, new to this process
    with pytest.raises(AssertionError, match=r"recompiled.*step 3"):
        assert_no_recompiles(retracing, (Stepped(x, 0),), [("step 3", (Stepped(x, 3),))])
    assert_no_recompiles(lambda x: x * 2, (x,), [("step 1", (x + 1,))])  # the same shapes: none


def test_the_regression_gate_compares_medians_and_recompiles(report):
    results = report["results"]
    assert_no_regression(results, report, tolerance=0.0)  # equal to itself
    faster = json.loads(json.dumps(report))
    for r in faster["results"]:
        r["run"]["median_s"] /= 4
    with pytest.raises(AssertionError, match="causal_build: median"):
        assert_no_regression(results, faster, tolerance=0.5)
    fewer = json.loads(json.dumps(report))
    worse = json.loads(json.dumps(results))
    worse[0]["recompiles"] = 1
    with pytest.raises(AssertionError, match="permutation: 1 recompiles"):
        assert_no_regression(worse, fewer)
    with pytest.raises(ValueError, match="no 'results'"):
        assert_no_regression(results, {"rows": []})


def test_results_are_never_written_into_the_checkout(report):
    root = checkout_root()
    assert root is not None
    with pytest.raises(ValueError, match="inside the meshbatch checkout"):
        write_report(report, root / "benchmarks")


def test_the_pytest_fixture_counts_and_gates(jit_bench):
    x = jnp.arange(4)
    with jit_bench.count_compiles() as compiled:
        jax.jit(lambda v: v + 3)(x)
    assert len(compiled) == 1
    with pytest.raises(AssertionError, match="recompiled"):
        jit_bench.assert_no_recompiles(retracing, (Stepped(x, 0),), [("step 5", (Stepped(x, 5),))])


def test_bench_refuses_unknown_names_and_too_few_repeats(tmp_path, capsys):
    assert main(["bench", "no_such_kernel", "--out", str(tmp_path)]) == 1
    assert "unknown benchmark 'no_such_kernel'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="repeats=5"):
        measure(lambda v: v, (jnp.zeros(2),), name="few", repeats=5)
    with count_compiles():
        pass


def _meta(pid, tid, kind, name):
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}}


def test_device_time_reads_a_tpu_like_and_a_gpu_like_trace():
    from meshbatch.bench.measure import per_call_seconds

    tpu = {"traceEvents": [
        _meta(1, 0, "process_name", "/device:TPU:0"), _meta(1, 7, "thread_name", "XLA Modules"),
        _meta(1, 8, "thread_name", "XLA Ops"), _meta(2, 0, "process_name", "/host:CPU"),
        *({"ph": "X", "pid": 1, "tid": 7, "ts": 10 * i, "dur": 2.0 + i} for i in range(3)),
        {"ph": "X", "pid": 1, "tid": 8, "ts": 0, "dur": 1.0},  # an op inside a module: not a call
        {"ph": "X", "pid": 2, "tid": 0, "ts": 0, "dur": 500.0},  # host work: not device time
    ]}  # fmt: skip
    assert per_call_seconds(tpu, 3) == pytest.approx([2e-6, 3e-6, 4e-6])
    gpu = {"traceEvents": [
        _meta(3, 0, "process_name", "/device:GPU:0"), _meta(3, 1, "thread_name", "Stream #13"),
        *({"ph": "X", "pid": 3, "tid": 1, "ts": i, "dur": 5.0} for i in range(8)),
    ]}  # fmt: skip
    assert per_call_seconds(gpu, 4) == pytest.approx([10e-6] * 4)
    with pytest.raises(RuntimeError, match="no device process"):
        per_call_seconds({"traceEvents": [_meta(2, 0, "process_name", "/host:CPU")]}, 1)


def test_device_time_refuses_a_cpu_profile():
    from meshbatch.bench.measure import device_seconds

    compiled = jax.jit(lambda v: v * 3).lower(jnp.arange(16)).compile()
    with pytest.raises(RuntimeError, match=r"device process|perfetto"):
        device_seconds(compiled, (jnp.arange(16),), calls=2)


def test_the_cli_gates_against_a_baseline(report, tmp_path, capsys):
    faster = json.loads(json.dumps(report))
    for r in faster["results"]:
        r["run"]["median_s"] /= 1000
    (tmp_path / "faster.json").write_text(json.dumps(faster))
    (tmp_path / "same.json").write_text(json.dumps(report))
    args = [
        "bench",
        "preblocked_block_build",
        "--tiny",
        "--dispatch-calls",
        "2",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main([*args, "--baseline", str(tmp_path / "faster.json")]) == 1
    assert "regression against" in capsys.readouterr().err
    assert main([*args, "--baseline", str(tmp_path / "same.json"), "--tolerance", "1000"]) == 0
    assert "no regression" in capsys.readouterr().out


def test_call_times_waits_for_every_call_and_names_a_bad_count():
    waited = []

    class Ready:  # what jax.block_until_ready calls on a result leaf
        def block_until_ready(self):
            time.sleep(0.002)
            waited.append(1)
            return self

    times = call_times(Ready, repeats=3, warmup=2)
    assert len(times) == 3 and len(waited) == 5  # warm-up calls are waited for too, not timed
    assert min(times) >= 0.002  # each timed call includes its wait
    with pytest.raises(ValueError, match="repeats=0"):
        call_times(Ready, repeats=0)
    with pytest.raises(ValueError, match="warmup=-1"):
        call_times(Ready, repeats=1, warmup=-1)
