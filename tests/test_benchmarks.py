"""Every benchmark script runs end to end in its ``--quick`` form (tiny sizes), so the scripts
that produce the README's figures do not rot. Outputs go to a temporary folder."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from concurrent_runs import AheadRuns, selected_params

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))
#: the arguments of each quick run beyond --quick: its outputs in the temporary folder, and one
#: process with one intra-op thread (as OMP_NUM_THREADS=1 gives the scripts without --threads);
#: parallel local search is checked in tests/search/test_pb_engine.py
WRITES_TO = {"c4_free_table": ["--out", "{tmp}/c4", "--n-max", "5", "--workers", "1"],
             "listops_backends": ["--out", "{tmp}/lo"],
             "long_sequence": ["--out", "{tmp}/ls"], "lm_training_step": ["--out", "{tmp}/lm"],
             "patternboost_triangle_free": ["--out", "{tmp}/pb", "--workers", "1"],
             "morphic": ["--threads", "1"], "morphic_generalisation": ["--threads", "1"],
             "morphic_variable_k": ["--tool", "internal", "--report", "{tmp}/mvk",
                                    "--threads", "1"],
             "gpu_diagnostics": ["--device", "cpu"],
             "gpu_idle": ["--device", "cpu", "--trace-dir", "{tmp}/traces"]}


def test_every_benchmark_is_covered():
    assert set(WRITES_TO) <= set(SCRIPTS)
    for name in SCRIPTS:
        assert "--quick" in (BENCHMARKS / f"{name}.py").read_text(), name


ENV = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")


def benchmark_command(name: str, args: list[str]) -> list[str]:
    return [sys.executable, str(BENCHMARKS / f"{name}.py"), *args]


def succeeded(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_benchmark(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return succeeded(subprocess.run(benchmark_command(name, args), capture_output=True,
                                    text=True, env=ENV, cwd=cwd, timeout=300))


def _quick_args(name: str, tmp: Path) -> list[str]:
    return ["--quick", *(a.format(tmp=tmp) for a in WRITES_TO.get(name, []))]


def _bf16_args(name: str, tmp: Path) -> list[str]:
    return [*(a.format(tmp=tmp) for a in DEVICE_DTYPE[name]), "--device", "cpu", "--dtype",
            "bfloat16"]


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The quick and bfloat16 runs of the selected tests below, started together, two at a
    time (:mod:`concurrent_runs`): key (kind, name) -> (the run, its folder)."""
    folders = {}
    runs = AheadRuns()
    for kind, test, make in (("quick", test_benchmark_quick_run_succeeds, _quick_args),
                             ("bf16", test_benchmark_runs_in_bfloat16_and_refuses_a_missing_gpu,
                              _bf16_args)):
        for name in selected_params(request, test, "name"):
            tmp = folders[kind, name] = tmp_path_factory.mktemp(f"{kind}_{name}")
            runs.start((kind, name), benchmark_command(name, make(name, tmp)), tmp, ENV, 300)
    yield lambda kind, name: (succeeded(runs.result((kind, name))), folders[kind, name])
    runs.close()


# Every script's quick run (a process of its own, 3 to 15 s of a core each on 2 cores) and the
# runs of a script with options are behind the slow marker (`pytest -m slow`); the scripts'
# own functions are tested below in the default run.
@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_quick_run_succeeds(name, ahead):
    done, _ = ahead("quick", name)
    assert done.stdout.strip(), f"{name} printed nothing"
    if name == "c4_free_table":  # --n-max holds with --quick too (n = 4..7 by default)
        rows = [line.split("|")[1].strip() for line in done.stdout.splitlines()
                if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
        assert sorted(set(rows)) == ["4", "5"], rows


#: the benchmarks with --device and --dtype, and the arguments of a short run of each
DEVICE_DTYPE = {"attention": ["--quick"], "graded_attention": ["--quick", "--rounds", "1"],
                "long_sequence": ["--quick", "--no-memory", "--backends", "full", "linear",
                                  "sliding_window", "--out", "{tmp}/ls"],
                "lm_training_step": ["--quick", "--out", "{tmp}/lm"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DEVICE_DTYPE))
def test_benchmark_runs_in_bfloat16_and_refuses_a_missing_gpu(name, ahead, monkeypatch):
    """The bfloat16 run is a process of its own, as a user starts it; the refusal calls the
    script's ``main`` here (each refuses in ``device_and_dtype``, before any work), which spares
    a second interpreter start: exiting with a message is what a nonzero status prints."""
    done, tmp = ahead("bf16", name)
    args = [a.format(tmp=tmp) for a in DEVICE_DTYPE[name]]
    assert "bfloat16" in done.stdout
    if not torch.cuda.is_available():
        monkeypatch.setattr(sys, "argv", [f"{name}.py", *args, "--device", "cuda"])
        with pytest.raises(SystemExit) as refused:
            _load(name).main()
        assert "CUDA is not available" in str(refused.value.code)


@pytest.mark.slow
def test_lm_training_step_times_every_model_in_one_run_at_the_shape_asked(tmp_path):
    shape = {"d_model": 32, "layers": 1, "heads": 2, "seq_len": 16, "batch": 2, "vocab": 64}
    flags = [x for k, v in shape.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    run_benchmark("lm_training_step", [*flags, "--rounds", "2", "--warmup", "1",
                                       "--out", str(tmp_path / "lm")], tmp_path)
    res = json.loads((tmp_path / "lm" / "results.json").read_text())
    assert res["shape"] == shape and (res["device"], res["dtype"]) == ("cpu", "float32")
    has_hf = importlib.util.find_spec("transformers") is not None
    arms = ["ungraded", "LGT", "EGT", "LGT fixed", "EGT fixed"]
    assert list(res["models"]) == arms + ["HF GPT-2"] * has_hf
    models = res["models"]
    for r in models.values():  # tokens/s is B·T over the median step time
        assert r["tokens_per_s"] == pytest.approx(2 * 16 / (r["ms_per_step"] / 1e3))
        assert r["time_over_ungraded"] == pytest.approx(
            r["ms_per_step"] / models["ungraded"]["ms_per_step"])
    if has_hf:  # the same architecture: as many parameters as the ungraded model
        assert models["HF GPT-2"]["params"] == models["ungraded"]["params"]
    assert "| LGT |" in (tmp_path / "lm" / "report.md").read_text()


@pytest.mark.slow
def test_lm_training_step_back_to_back_times_k_unsynchronised_steps_per_call(tmp_path, capsys):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import lm_training_step
    finally:
        sys.path.remove(str(BENCHMARKS))
    from graded.checks import inputs_checked

    seen = []
    lm_training_step.back_to_back(lambda: seen.append(inputs_checked()), 3)()
    assert seen == [True, True, True]  # k steps, each inside checked_inputs
    run_benchmark("lm_training_step", ["--quick", "--back-to-back", "2", "--rounds", "2",
                                       "--no-hf", "--out", str(tmp_path / "lm")], tmp_path)
    res = json.loads((tmp_path / "lm" / "results.json").read_text())
    assert res["back_to_back"] == 2
    assert "2 steps back to back per call" in (tmp_path / "lm" / "report.md").read_text()
    with pytest.raises(SystemExit) as bad:  # the script's own parser, without a new process
        lm_training_step.parse_args(["--back-to-back", "0"])
    assert bad.value.code != 0
    assert "--back-to-back must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_lm_training_step_times_the_previous_folds_beside_in_one_run(tmp_path):
    """--compare-folds: a twin of each graded arm runs with the previous form of the folds
    (``_timing.previous_folds``: FoldedLinears.previous_form on for the twin's calls only,
    back off after, also after an exception)."""
    timing = _load("_timing")
    from graded.folding import FoldedLinears

    seen = []
    timing.previous_folds(lambda: seen.append(FoldedLinears.previous_form))()
    assert seen == [True] and not FoldedLinears.previous_form

    def fail():
        raise RuntimeError("in the step")

    with pytest.raises(RuntimeError, match="in the step"):
        timing.previous_folds(fail)()
    assert not FoldedLinears.previous_form
    run_benchmark("lm_training_step", ["--quick", "--rounds", "1", "--no-hf", "--models",
                                       "LGT", "--compare-folds",
                                       "--out", str(tmp_path / "lm")], tmp_path)
    res = json.loads((tmp_path / "lm" / "results.json").read_text())
    assert list(res["models"]) == ["ungraded", "LGT", "LGT, previous folds"]
    assert res["compare_folds"] is True


def test_the_lead_in_ends_at_each_forward_passs_first_matrix_product():
    """``_timing.lead_in_times``: the host time from a call to its first ``F.linear`` (torch's
    module reaches it through ``F.multi_head_attention_forward``), each pass on its own;
    F.linear is restored afterwards."""
    import time

    timing = _load("_timing")
    linear = torch.nn.functional.linear
    w = torch.randn(3, 3)

    def slow_then_linear():
        time.sleep(0.02)
        torch.nn.functional.linear(torch.randn(2, 3), w)
        time.sleep(0.05)  # after the product: not in the lead-in

    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 4, 8)
    lead = timing.lead_in_times({"slow": slow_then_linear,
                                 "torch": lambda: attention(x, x, x, need_weights=False)},
                                rounds=3)
    assert 0.02 <= lead["slow"] < 0.045
    assert 0 < lead["torch"] < 0.02
    assert torch.nn.functional.linear is linear


def test_kernels_are_counted_as_a_gpu_would_launch_them():
    """``_timing.KernelCount``: views and allocations launch nothing, a foreach operator over
    pairs of one shape is one multi-tensor kernel, over weights times their row scales one
    kernel per pair; ``lead_in`` counts the kernels before the first matrix product, ``tail``
    those after the last."""
    timing = _load("_timing")
    w = [torch.randn(4, 3), torch.randn(5, 3)]
    rows = [torch.rand(4, 1), torch.rand(5, 1)]
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    one = torch.ones(())
    with timing.KernelCount() as count:
        x = torch.empty(2, 3)  # none
        x.t().unsqueeze(0)  # views: none
        torch._foreach_mul(w, w)  # fused: 1
        torch._foreach_mul(w, rows)  # per pair: 2
        a @ b  # the first product: 1
        x.add(1)  # 1
        one.item()  # a value read: none
        torch.promote_types(torch.bfloat16, torch.float32)  # no tensor: none
        torch.arange(3)  # no tensor in, one out: 1
    assert (count.count, count.lead_in, count.tail) == (1 + 2 + 1 + 1 + 1, 1 + 2, 2)
    assert count.operators == 10  # every dispatch, launching or not
    with timing.KernelCount() as count:
        x.add(1)  # 1
        a @ b  # 1
        x.mul(2)  # 1
        a @ b  # the last product: 1
        x.add(1).neg()  # 2
        x.t()  # a view: none
    assert (count.count, count.lead_in, count.tail) == (6, 1, 2)
    with timing.KernelCount() as count:
        x.add(1)
    assert (count.lead_in, count.tail) == (None, None)  # no product


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat != "kernel" else 0,
            "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_gpu_idle_attributes_each_gap_to_the_launch_that_ends_it():
    """A hand-made trace: kernels at 30–50, 70–80 and 75–85 µs of a step from 0 to 100 µs on
    the host. Idle: the lead-in 0–30 (forward; ended by the launch inside aten::addmm), 50–70
    (backward; launched from the autograd thread inside MulBackward0) and the host's tail
    85–100; a kernel launched outside the step is not counted."""
    bench = _load("gpu_idle")
    trace = {"traceEvents": [
        _x("user_annotation", "profiled_step", 0, 100),
        _x("user_annotation", "forward", 5, 35), _x("user_annotation", "backward", 40, 40),
        _x("user_annotation", "optimizer", 80, 15),
        _x("cpu_op", "aten::linear", 10, 10), _x("cpu_op", "aten::addmm", 12, 6),
        _x("cuda_runtime", "cudaLaunchKernel", 15, 1, correlation=1),
        _x("cpu_op", "MulBackward0", 54, 8, tid=2), _x("cpu_op", "aten::mul", 55, 5, tid=2),
        _x("cuda_runtime", "cudaLaunchKernel", 56, 1, tid=2, correlation=2),
        _x("cuda_runtime", "cudaLaunchKernel", 58, 1, tid=2, correlation=3),
        _x("kernel", "gemm", 30, 20, tid=7, correlation=1),
        _x("kernel", "mul", 70, 10, tid=7, correlation=2),
        _x("kernel", "mul2", 75, 10, tid=8, correlation=3),
        _x("cuda_runtime", "cudaLaunchKernel", 200, 1, correlation=9),
        _x("kernel", "late", 210, 5, tid=7, correlation=9),
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    ]}
    r = bench.idle_report(trace)
    assert (r.steps, r.kernels, r.step_us, r.busy_us, r.idle_us) == (1, 3, 100, 35, 65)
    assert dict(r.idle_by_phase) == {"forward": 30, "backward": 20, "outside": 15}
    assert dict(r.busy_by_phase) == {"forward": 20, "backward": 15}  # 70–80 and 80–85
    assert dict(r.host_by_phase) == {"forward": 35, "backward": 40, "optimizer": 15}
    assert r.causes == {("forward", "(lead-in) aten::addmm"): [30, 1],
                        ("backward", "aten::mul"): [20, 1], ("outside", "(host tail)"): [15, 1]}
    lines = r.lines()
    assert "idle 0.07 ms" in lines[0] and "kernels 3 per step" in lines[0]
    assert "forward 0.04 | 0.02 | 0.03, backward 0.04 | 0.01 | 0.02" in lines[0]
    assert "backward  aten::mul" in lines[2]
    # two steps read as one window: the same gaps, per step halved
    trace["traceEvents"][0]["name"] = "profiled_steps"
    both = bench.idle_report(trace, "profiled_steps", 2)
    assert (both.steps, both.idle_us) == (2, 65)


def test_gpu_idle_writes_chrome_traces_that_it_reads_back(tmp_path):
    bench = _load("gpu_idle")
    report = bench.profile_arm("LGT", bench.ARMS["LGT"], bench.QUICK, torch.device("cpu"), 2,
                               False, tmp_path)
    assert report.steps == 2 and report.kernels == 0 and report.step_us > 0
    trace = json.loads((tmp_path / "trace_LGT.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"profiled_step", "forward", "backward", "optimizer"} <= names


def test_a_bad_round_count_or_length_is_named_not_a_bare_crash(capsys, monkeypatch):
    """``--rounds 0`` (and morphic.py's ``--reps 0``) used to end in statistics' "no median for
    empty data" and ``--lengths 0`` in "math domain error"; each now names the value given."""
    timing = _load("_timing")
    with pytest.raises(ValueError, match=r"rounds must be >= 1 .*got 0"):
        timing.interleaved({"a": lambda: None}, rounds=0, warmup=0)
    assert set(timing.interleaved({"a": lambda: None}, rounds=1, warmup=0)) == {"a"}
    long_sequence = _load("long_sequence")
    with pytest.raises(SystemExit):
        long_sequence.parse_args(["--quick", "--lengths", "256", "0"])
    assert "--lengths must be positive sequence lengths, got [256, 0]" in capsys.readouterr().err
    assert long_sequence.parse_args(["--quick", "--lengths", "256"]).lengths == [256]
    monkeypatch.setattr(sys, "argv", ["morphic.py", "--reps", "0"])
    with pytest.raises(SystemExit):
        _load("morphic").main()
    assert "--reps must be at least 1 (timed repetitions), got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _load("trainer_overhead").main(["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_graded_attention_times_each_variant_unfolded_in_the_same_rounds(tmp_path):
    done = run_benchmark("graded_attention", ["--quick", "--rounds", "1", "--no-lm",
                                              "--compare-unfolded"], tmp_path)
    rows = [line.split("|")[2].strip() for line in done.stdout.splitlines()
            if line.startswith("| B=")]
    assert rows[0] == "ours, ungraded"  # our plain module, the second reference
    folded = [r for r in rows[1:] if not r.endswith(" unfolded")]
    assert len(folded) == 8 and [r for r in rows if r.endswith(" unfolded")] == [
        f"{r} unfolded" for r in folded]


@pytest.mark.slow
def test_morphic_split_comparison_times_layers_that_differ_only_in_the_split(tmp_path):
    """benchmarks/morphic.py --split-only: per-grade slices and one torch.split give the same
    components, and the two timed steps (same seed) the same gradient of the state."""
    from graded.morphic import Grade, GradedStateSpace

    bench = _load("morphic")
    grades = [Grade(f"g{i}", 3, i) for i in range(4)]
    space, sliced = GradedStateSpace(grades), bench.SlicedSpace(grades)
    z = torch.randn(2, 5, space.total_dim)
    for (g, a), (h, b) in zip(space.split(z).items(), sliced.split(z).items()):
        assert g == h and torch.equal(a, b)
    pairs = bench.make_edges(space, 8)
    targets = torch.randint(0, 11, (2, 5))
    grads = []
    for sp in (space, sliced):
        torch.manual_seed(0)
        step = bench.OurStep(sp, pairs, 11, utilities=True, rank=4)
        zz = z.clone().requires_grad_(True)
        step(zz, targets)
        grads.append(zz.grad)
    torch.testing.assert_close(grads[0], grads[1])
    done = run_benchmark("morphic", ["--quick", "--split-only", "--threads", "1"], tmp_path)
    out = json.loads(done.stdout)
    assert set(out["median_seconds"]) == {"torch_split", "per_grade_slices"}
    assert out["edges"] == 8 and out["slices_over_split"]["ratio_of_medians"] > 0


@pytest.mark.slow
def test_morphic_variable_k_trains_each_distillation_teacher_in_one_run(tmp_path):
    done = run_benchmark("morphic_variable_k", [
        "--quick", "--tool", "internal", "--train-routing", "utility", "--distill-teacher",
        "utility", "full", "--no-typed-readout", "--threads", "1"], tmp_path)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["distill_teacher"], r["train_routing"], r["typed_readout"]) for r in rows] == [
        ("utility", "utility", False), ("full", "utility", False)]


def test_morphic_fixed_adder_bayes_rate_matches_the_integral():
    """P(argmax(e_0 + σn) = 0) = E[Φ((1 + σ n_0)/σ)^{p−1}], by quadrature, against the
    benchmark's Monte Carlo estimate (200 000 draws: standard error below 0.0005)."""
    import math

    bench = _load("morphic_fixed_adder")
    t = torch.linspace(-12, 12, 100001, dtype=torch.float64)
    density = torch.exp(-t * t / 2) / math.sqrt(2 * math.pi)
    for noise in (0.3, 0.6):
        cdf = 0.5 * (1 + torch.erf((1 + noise * t) / noise / math.sqrt(2)))
        exact = float((density * cdf**6).sum() * (t[1] - t[0]))
        assert bench.bayes_rate(7, noise, draws=200_000) == pytest.approx(exact, abs=0.003)


@pytest.mark.slow
def test_patternboost_step_cost_times_both_encodings_in_one_run(tmp_path):
    """patternboost_triangle_free.py --step-cost: one table, the packed and the raw encoding,
    with the tokens per object of an n-vertex graph's C(n, 2) upper-triangle bits."""
    done = run_benchmark("patternboost_triangle_free", ["--quick", "--step-cost"], tmp_path)
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines()
            if line.startswith("| ") and "bit" in line]
    bits = 8 * 7 // 2  # --quick: n = 8
    assert [(r[0].strip(), int(r[1])) for r in rows] == [
        ("4 bits per token", -(-bits // 4)), ("1 bit per token", bits)]
    assert rows[1][3].strip() == "1.00" and float(rows[0][2]) > 0


@pytest.mark.parametrize("n_min, n_max", [(1, 5), (6, 5)])
def test_c4_free_table_refuses_sizes_it_cannot_run_before_any_run(n_min, n_max, monkeypatch):
    """--n-min 1 passed the check and ended in a ValueError traceback (a graph needs 2
    vertices); the refusal names the value and the allowed range."""
    monkeypatch.setattr(sys, "argv", ["c4_free_table.py", "--n-min", str(n_min), "--n-max",
                                      str(n_max), "--out", "unused"])
    with pytest.raises(SystemExit) as refused:
        _load("c4_free_table").main()
    assert str(refused.value.code) == f"--n-min must be in [2, --n-max={n_max}], got {n_min}"


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_interleaved_rounds_put_each_candidate_in_each_place_and_none_twice_in_a_row(n):
    """``_timing.interleaved`` (and ``lead_in_times``, ``cached_generation``, through
    ``round_order``): over n rounds each of n >= 3 candidates takes each place once, and no
    candidate runs twice in a row, across the rounds' seams included. The order reversed
    every other round before: with three or more candidates the first and the last ran
    twice in a row at every seam (A B C | C B A | A B C), half their calls straight after one
    of their own, torch's module (the first, the ratios' denominator) among them."""
    timing = _load("_timing")
    names = "ABCDE"[:n]
    calls = []
    timing.interleaved({c: (lambda c=c: calls.append(c)) for c in names}, rounds=2 * n,
                       warmup=0)
    assert sorted(calls) == sorted(names * 2 * n)
    assert all(a != b for a, b in itertools.pairwise(calls)), calls
    if n >= 3:
        rounds = [calls[i:i + n] for i in range(0, len(calls), n)]
        for place in range(n):
            assert sorted(r[place] for r in rounds) == sorted(names * 2)
    seen = []
    timing.lead_in_times({c: (lambda c=c: (seen.append(c), torch.nn.functional.linear(
        torch.ones(1, 1), torch.ones(1, 1)))) for c in names}, rounds=2 * n)
    assert seen == calls  # the same orders


def test_attention_causal_rows_give_both_modules_the_same_kernel_call(monkeypatch, capsys):
    """benchmarks/attention.py --causal was accepted and ignored (no causal row). Now each
    module is called as its API asks for causal self-attention (torch's with the boolean
    causal mask and the hint, ours with the hint), and both reach the fused kernel with no
    mask and is_causal=True: the same work, the same output as an explicit masked softmax."""
    bench = _load("attention")
    import graded

    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    ours = graded.MultiheadAttention(16, 2, batch_first=True)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 16)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is None, is_causal, dropout_p))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    outs = []
    for module in (ref, ours):
        calls.clear()
        opts = bench.causal_options(module, 5)
        outs.append(module(x, x, x, need_weights=False, **opts)[0])
        assert calls == [(True, True, 0.0)], type(module)
        bench.step(module, x.clone().requires_grad_(), opts)  # forward + backward runs
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    masked, _ = ref(x, x, x, need_weights=False, attn_mask=~keep)  # explicit mask, no hint
    torch.testing.assert_close(outs[0], masked)
    torch.testing.assert_close(outs[1], masked)
    monkeypatch.undo()
    bench.main(["--quick", "--causal", "--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| B=")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "B=2, T=64, d=64, h=4", "B=2, T=64, d=64, h=4, causal"]


#: (script, arguments, what --quick alone sets, what the arguments given must keep)
QUICK_KEEPS = [
    ("attention", ["--rounds", "1"], {"rounds": 3}, {"rounds": 1}),
    ("graded_attention", ["--rounds", "1"], {"rounds": 3}, {"rounds": 1}),
    ("lm_training_step", ["--rounds", "2", "--d-model", "32"],
     {"rounds": 3, "d_model": 64, "layers": 2}, {"rounds": 2, "d_model": 32, "layers": 2}),
    ("host_overhead", ["--rounds", "30"], {"rounds": 5, "calls": 2},
     {"rounds": 30, "calls": 2}),
    ("trainer_overhead", ["--sizes", "tiny", "--rounds", "3"],
     {"sizes": ["tiny", "dyck"], "rounds": 2, "steps": 5},
     {"sizes": ["tiny"], "rounds": 3, "steps": 5}),
    ("long_sequence", ["--repeats", "3"], {"repeats": 1, "error_seeds": 1},
     {"repeats": 3, "error_seeds": 1}),
    ("cached_generation", ["--tokens", "512"], {"tokens": 256, "block": 64},
     {"tokens": 512, "block": 64}),
    ("listops_backends", ["--steps", "3"], {"steps": 2, "batch": 8}, {"steps": 3, "batch": 8}),
]


@pytest.mark.parametrize("name, given, quick, kept", QUICK_KEEPS, ids=[q[0] for q in QUICK_KEEPS])
def test_quick_sets_only_the_options_left_out(name, given, quick, kept):
    """``--quick`` replaced options given on the same command line (``--quick --rounds 1``
    timed 3 rounds; lm_training_step's ``--quick --d-model 32`` ran d_model 64): now it sets
    only what the command line leaves out, and without it the defaults stand."""
    bench = _load(name)
    alone = vars(bench.parse_args(["--quick"]))
    assert {k: alone[k] for k in quick} == quick
    both = vars(bench.parse_args(["--quick", *given]))
    assert {k: both[k] for k in kept} == kept
    default, full = vars(bench.parse_args([])), vars(bench.parse_args(given))
    named = {a[2:].replace("-", "_") for a in given if a.startswith("--")}
    for k in kept:  # no --quick: what is given, else the default
        assert full[k] == (kept[k] if k in named else default[k]), k


@pytest.mark.parametrize("name, argv, message", [
    ("attention", ["--rounds", "0"], "--rounds must be at least 1"),
    ("graded_attention", ["--quick", "--rounds", "0"], "--rounds must be at least 1"),
    ("lm_training_step", ["--warmup", "-1"], "--warmup must be at least 0, got -1"),
    ("lm_training_step", ["--quick", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    ("host_overhead", ["--calls", "0"], "--calls must be at least 1, got 0"),
    ("long_sequence", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
    ("long_sequence", ["--threads", "0"], "--threads must be at least 1, got 0"),
    ("trainer_overhead", ["--threads", "0"], "--threads must be at least 1, got 0"),
    ("cached_generation", ["--tokens", "1000"], "--tokens must be a multiple of --block (512)"),
])
def test_a_bad_count_is_refused_by_the_parser_naming_it(name, argv, message, capsys):
    """Counts that ended in a traceback (``interleaved``'s ValueError, statistics' "no median
    for empty data") or, for cached_generation's --tokens 1000 with blocks of 512, a table
    whose rows had one column more than its header, are refused with the value given."""
    with pytest.raises(SystemExit):
        _load(name).parse_args(argv)
    assert message in capsys.readouterr().err
