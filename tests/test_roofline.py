"""book.roofline against hand calculations (chapter 02)."""
import math

import pytest
import torch

from book import models, roofline as R
from book.hardware import Ceilings


def test_datasheet_ridge_points_by_hand():
    a100 = R.Roof.datasheet("A100 80GB", "bf16")
    assert a100.ridge == pytest.approx(312e12 / 2039e9) == pytest.approx(153.0, abs=0.1)
    assert R.Roof.datasheet("H200", "bf16").ridge == pytest.approx(989.4e12 / 4.8e12)      # 206 FLOPs/byte
    assert R.Roof.datasheet("A100 40GB", "fp16").ridge == pytest.approx(200.6, abs=0.1)
    with pytest.raises(ValueError, match="no bf16"):
        R.Roof.datasheet("T4", "bf16")


def test_attainable_bends_at_the_ridge():
    roof = R.Roof("toy", bandwidth=100.0, peak=1000.0)
    assert roof.ridge == 10
    assert roof.attainable(1) == 100 and roof.attainable(10) == 1000 and roof.attainable(1e6) == 1000
    assert roof.time(R.Work(flops=1000, bytes=50)) == 1.0           # memory: 50 B / 100 B/s = 0.5 s < 1 s
    assert roof.bound(R.Work(1000, 1000)) == "memory" and roof.bound(R.Work(1e5, 10)) == "compute"
    with pytest.raises(ValueError, match="intensity"):
        roof.attainable(-1)
    with pytest.raises(ValueError, match="bandwidth"):
        R.Roof("bad", 0, 1)


def test_measured_roof_reads_the_ceilings():
    c = Ceilings(device="cpu-x", kind="cpu", read_bw=20e9, copy_bw=15e9, matmul={"fp32": 3e11},
                 bytes_tested=1, matmul_sizes={"fp32": 1024})
    roof = R.Roof.measured(c, "fp32")
    assert roof.bandwidth == 20e9 and roof.ridge == pytest.approx(15) == c.ridge_point("fp32")
    assert R.Roof.measured(c, "fp32", bandwidth="copy").bandwidth == 15e9
    with pytest.raises(ValueError, match="measured"):
        R.Roof.measured(c, "bf16")


def test_the_fastest_measured_precision_wins_and_ties_go_to_the_first():
    def ceil(**rates):
        return Ceilings(device="x", kind="cpu", read_bw=1e9, copy_bw=1e9, matmul=rates, bytes_tested=1,
                        matmul_sizes={})
    assert ceil(fp32=3e11, bf16=2e12, fp16=1e11).fastest() == "bf16"
    assert ceil(fp32=3e11, bf16=2e11).fastest(("bf16", "fp32")) == "fp32"
    assert ceil(fp32=1e12, bf16=1e12).fastest(("bf16", "fp32")) == "bf16"
    assert ceil(fp32=1e12).fastest() == "fp32"                      # unmeasured precisions count as zero


def test_intensity_of_the_basic_operations():
    assert R.dot(10**6, "fp32").intensity == pytest.approx(0.25, rel=1e-5)          # 2n FLOPs / 8n bytes
    assert R.matvec(4096, 4096, "fp16").intensity == pytest.approx(1.0, rel=1e-3)   # 2 FLOPs per 2-byte weight
    assert R.matmul(4096, 4096, 4096, "fp16").intensity == pytest.approx(4096 / 3)
    assert R.linear(1, 4096, 4096, "bf16").intensity == pytest.approx(1.0, rel=1e-3)
    assert R.linear(64, 4096, 4096, "bf16").intensity == pytest.approx(64 * 4096 / (4096 + 128), rel=1e-9)
    assert R.linear(64, 4096, 4096, "int8", "bf16").intensity > 1.9 * R.linear(64, 4096, 4096, "bf16").intensity
    with pytest.raises(ValueError, match="batch"):
        R.linear(0, 4, 4)


def test_decode_step_of_llama2_7b_by_hand():
    w = R.decode_step("Llama-2-7B", 1, 0, "bf16")
    matmul_params = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096
    assert matmul_params == 6_607_077_376
    parts = dict(w.parts)
    assert parts["weights"] == 2 * (6_738_415_616 - 32000 * 4096)             # all but the embedding table
    assert parts["KV cache"] == 2 * 32 * 32 * 128 * 2                         # the new token's K and V
    assert w.flops == 2 * matmul_params + 4 * 32 * 32 * 128
    assert w.intensity == pytest.approx(1.0, rel=0.01)                        # ~1 FLOP/byte in bf16
    long = R.decode_step("Llama-2-7B", 8, 4095, "bf16")
    assert dict(long.parts)["KV cache"] == 8 * 4096 * 524_288
    with pytest.raises(ValueError, match="allows 4096"):
        R.decode_step("Llama-2-7B", 1, 4096)
    with pytest.raises(KeyError, match="unknown model"):
        R.decode_step("Llama-9-1T")


def test_critical_batch_is_where_decode_turns_compute_bound():
    a100 = R.Roof.datasheet("A100 80GB", "bf16")
    b = R.critical_batch("Llama-2-7B", a100, context=0)
    assert 150 <= b <= 160                                                    # ~ the ridge point, 153
    assert a100.bound(R.decode_step("Llama-2-7B", b, 0)) == "compute"
    assert a100.bound(R.decode_step("Llama-2-7B", b - 1, 0)) == "memory"
    b70 = R.critical_batch("Llama-2-70B", a100, context=512)
    assert a100.bound(R.decode_step("Llama-2-70B", b70, 512)) == "compute"
    assert a100.bound(R.decode_step("Llama-2-70B", b70 - 1, 512)) == "memory"
    # at 4096 tokens each sequence's K and V outweigh its FLOPs: no batch is compute-bound
    assert R.critical_batch("Llama-2-7B", a100, context=4095) is None
    assert R.critical_batch("Llama-2-7B", a100, context=0, weight_dtype="int4", kv_dtype="bf16") < b / 3


def test_prefill_is_far_more_intense_than_decode():
    p = R.prefill("Llama-2-7B", 1024)
    assert p.intensity > 300 and R.decode_step("Llama-2-7B").intensity < 1.1
    with pytest.raises(ValueError, match="allows 4096"):
        R.prefill("Llama-2-7B", 5000)
    # the LM head runs on the last prompt token only: n tokens cost n - 1 tokens' head FLOPs less than n decode steps
    a = models.architecture("Llama-2-7B")
    head = 2 * a.vocab * a.hidden
    two, one = R.prefill(a, 2), R.prefill(a, 1)
    assert one.flops == R.decode_step(a).flops and two.flops - one.flops == pytest.approx(
        R.decode_step(a, context=1).flops - head, rel=1e-3)


def test_utilisations():
    assert R.mbu(13.5e9, 0.01, 2.0e12) == pytest.approx(0.675)
    assert R.mfu(13.2e9, 0.01, 312e12) == pytest.approx(13.2e9 / 0.01 / 312e12)
    with pytest.raises(ValueError, match="seconds"):
        R.mbu(1, 0, 1)
    assert math.isclose(R.mbu(1, 1, 1), 1.0)


def test_plot_roofline_draws_roofs_and_points():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    R.plot_roofline(ax, [R.Roof.datasheet("A100 80GB"), R.Roof.datasheet("H200")], [("decode B=1", 1.0, 2e12)])
    assert len(ax.lines) >= 5 and ax.get_xscale() == "log"
    plt.close(fig)


def _tiny_llama():
    """A one-layer Llama-shaped decoder with random weights, small enough to time in a unit test."""
    from book.llama import Llama
    from dataclasses import replace
    from book.models import architecture, build_random
    tiny = replace(architecture("Llama-2-7B"), name="tiny", n_layers=1, hidden=64, n_heads=4, n_kv_heads=2,
                   head_dim=16, intermediate=128, vocab=256)
    return Llama.from_hf(build_random(tiny, dtype="fp32"))


def test_decode_step_timing_at_a_given_context_with_a_random_cache():
    model = _tiny_llama()
    t = R.measure_decode_step(model, batch=3, context=20, warmup=1, repeats=3)
    assert t.median > 0 and model.cache.lengths.tolist() == [21, 21, 21]
    assert model.cache.k[:, :3, :, :20].abs().sum() > 0 and model.cache.k[:, :3, :, 21:].abs().sum() == 0
    with pytest.raises(ValueError, match="one position left"):
        model.cache.fill_random(3, model.cache.max_len)
    with pytest.raises(ValueError, match="context"):
        R.measure_decode_step(model, batch=1, context=-1)


def test_passes_of_several_shapes_are_timed_in_turn_from_one_cache():
    model = _tiny_llama()
    ts = R.measure_extends(model, [(1, 1), (2, 5), (1, 5)], context=20, rounds=2)
    assert set(ts) == {(1, 1), (2, 5), (1, 5)} and all(len(t.times) == 2 and t.median > 0 for t in ts.values())
    assert model.cache.batch == 2 and model.cache.max_len == 25        # one cache, for the largest of each
    assert model.cache.lengths.tolist() == [25]                         # the last pass: batch 1, 5 tokens past 20
    with pytest.raises(ValueError, match="shape"):
        R.measure_extends(model, [], context=5)


def test_decode_steps_at_several_batches_are_timed_in_turn_from_one_cache():
    model = _tiny_llama()
    ts = R.measure_decode_steps(model, [1, 4, 2], context=20, warmup=1, rounds=2)
    assert [len(t.times) for t in ts] == [2, 2, 2] and all(t.median > 0 for t in ts)
    assert model.cache.batch == 4 and model.cache.max_len == 21       # one cache, for the largest batch
    assert model.cache.lengths.tolist() == [21, 21]                     # the last call: batch 2, one step past 20
    *steps, read = R.measure_decode_steps(model, [1, 2], context=20, rounds=3, read_bytes=2**20)  # sum beside
    assert len(steps) == 2 and len(read.times) == 3 and read.median > 0
    with pytest.raises(ValueError, match="batch"):
        R.measure_decode_steps(model, [0, 2], context=5)
    with pytest.raises(ValueError, match="at least one"):
        R.measure_decode_steps(model, [], context=5)


def test_a_decode_step_function_needs_a_cache_that_holds_its_batch_and_context():
    model = _tiny_llama()
    model.setup_cache(2, 11)
    model.cache.fill_random(2, 10)
    step = R.decode_step_fn(model, 6, 1)
    for _ in range(2):                       # every call starts back at 6 cached tokens
        step()
        assert model.cache.lengths.tolist() == [7]
    with pytest.raises(ValueError, match="setup_cache"):
        R.decode_step_fn(model, 6, 3)
    with pytest.raises(ValueError, match="setup_cache"):
        R.decode_step_fn(model, 11, 1)


def test_compiled_decode_timing_falls_back_to_none_and_leaves_the_model_eager(monkeypatch, capsys):
    from book.llama import Llama
    model = _tiny_llama()

    def no_compiler(self, mode=None, bucket=None):      # compile_decode's own fallback: torch.compile unavailable
        self._compiled = None
        return self
    monkeypatch.setattr(Llama, "compile_decode", no_compiler)
    assert R.compiled_decode_ms(model, context=8) is None
    assert model.cache.max_len == 9 and model._compiled is None

    def broken(self, mode=None, bucket=None):
        raise RuntimeError("no backend")
    monkeypatch.setattr(Llama, "compile_decode", broken)
    assert R.compiled_decode_ms(model) is None
    assert "could not be timed here (RuntimeError: no backend)" in capsys.readouterr().out
    assert model._compiled is None and R.measure_decode_step(model, 1, 8, warmup=0, repeats=1).median > 0

    def fake(self, mode=None, bucket=None):            # a "compiled" step that is the eager one: a number comes back
        self._compiled = self._decode
        self._bucket = 4
        return self
    monkeypatch.setattr(Llama, "compile_decode", fake)
    assert R.compiled_decode_ms(model, context=8) > 0 and model._compiled is None


def test_a_small_matmul_sweep_and_its_knee():
    rows = R.linear_sweep([1, 2, 4, 64], 64, 128, "fp32", "cpu", repeats=2)
    assert [r["batch"] for r in rows] == [1, 2, 4, 64]
    assert all(r["seconds"] > 0 and r["flop_rate"] == r["flops"] / r["seconds"] for r in rows)
    assert all(r["spread"] >= 0 for r in rows)                  # two rounds, every batch in each
    assert rows[-1]["intensity"] > rows[0]["intensity"] and "read_bw" not in rows[0]
    read = R.linear_sweep([1, 2], 64, 128, "fp32", "cpu", repeats=2, read_bytes=2**20)   # a sum in the same rounds
    assert read[0]["read_bw"] == read[1]["read_bw"] > 0
    with pytest.raises(ValueError, match="read_bytes"):
        R.linear_sweep([1], 64, 128, "fp32", "cpu", read_bytes=-1)
    fake = [{"batch": b, "seconds": max(1.0, b / 8), "flops": 10.0 * b, "flop_rate": 10.0 * b / max(1.0, b / 8)}
            for b in (1, 2, 4, 8, 16, 32)]
    assert R.measured_knee(fake) == pytest.approx(8.0)        # flat 1 s until b = 8, then 80 FLOP/s
    with pytest.raises(ValueError, match="at least two"):
        R.measured_knee(fake[:1])


def test_first_compute_bound_matches_a_linear_scan():
    roof = R.Roof.datasheet("A100 80GB", "bf16")
    work = lambda b: R.linear(b, 4096, 4096, "bf16")                # noqa: E731
    b = R.first_compute_bound(work, roof)
    assert roof.bound(work(b)) == "compute" and roof.bound(work(b - 1)) == "memory"
    assert b == next(i for i in range(1, 10**4) if roof.bound(work(i)) == "compute")
    assert R.first_compute_bound(lambda b: R.Work(1.0, 1e9), roof, limit=64) is None


def test_busy_while_counts_calls_and_cpu_time():
    x = torch.randn(256, 256)
    out = R.busy_while(lambda: x @ x, "cpu", seconds=0.2)
    assert out["calls"] >= 1 and out["wall"] >= 0.2 and 0 < out["cpu_busy"] <= 1.5
    assert out["cpu_cores"] == pytest.approx(out["cpu_busy"] * out["threads"]) and out["threads"] >= 1
    assert out["gpu_busy"] is None
    with pytest.raises(ValueError, match="seconds"):
        R.busy_while(lambda: None, "cpu", seconds=0)


def test_silence_native_stderr_swallows_fd_2_and_restores_it(capfd):
    import os
    with R.silence_native_stderr():
        os.write(2, b"from C++\n")
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert "from C++" not in err and "after" in err


def test_silence_native_stderr_drops_the_profiler_cycle_warning_only(recwarn):
    import warnings
    with R.silence_native_stderr():      # torch 2.11's profiler on CUDA warns this on every run (chapter 02)
        warnings.warn("Warning: Profiler clears events at the end of each cycle.", UserWarning)
    assert len(recwarn) == 0
    with R.silence_native_stderr():
        warnings.warn("something else", UserWarning)
    assert [str(w.message) for w in recwarn] == ["something else"]


def test_busy_while_notes_a_failing_nvml_and_still_reports_the_rest(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise ModuleNotFoundError("pynvml does not seem to be installed")

    monkeypatch.setattr(torch.cuda, "utilization", broken)
    out = R.busy_while(lambda: sum(range(100)), "cpu", seconds=0.1, sample_gpu=True)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == ["note: NVML utilisation sampling failed on this device (ModuleNotFoundError: pynvml does "
                       "not seem to be installed); the GPU busy share is left out"]
    assert out["gpu_busy"] is None and out["calls"] > 0 and out["cpu_busy"] > 0 and out["wall"] >= 0.1


def test_extend_is_a_decode_step_at_one_token_and_reads_the_weights_once():
    one, step = R.extend("Llama-2-7B", 1, batch=2, context=100), R.decode_step("Llama-2-7B", 2, 100)
    assert one.flops == pytest.approx(step.flops) and one.bytes == pytest.approx(step.bytes, rel=1e-3)
    eight = R.extend("Llama-2-7B", 8, batch=2, context=100)
    assert eight.flops == pytest.approx(8 * one.flops, rel=0.01)             # FLOPs scale with the tokens...
    assert eight.bytes < 1.01 * one.bytes                                     # ...the bytes hardly move
    with pytest.raises(ValueError, match="do not fit"):
        R.extend("Llama-2-7B", 8, context=4092)


def test_extend_timing_with_a_random_cache():
    model = _tiny_llama()
    t = R.measure_extend(model, tokens=4, batch=2, context=20, warmup=1, repeats=2)
    assert t.median > 0 and model.cache.lengths.tolist() == [24, 24]


def test_step_shortfall_splits_kernels_from_fixed_costs():
    GB = 1e9
    quick = R.step_shortfall(3.77 * GB, 0.210, 15.9 * GB)     # 237 ms at the kernels' rate, done in 210: varies
    assert "took less than that" in quick and "accounts for" not in quick
    # an H200-like eager step: 13.3 GB in 18.8 ms, layers stream 2,237 GB/s (5.95 ms): the rest is fixed cost
    why = R.step_shortfall(13.3 * GB, 18.8e-3, 2237 * GB, "one-row products over 4096-row layers")
    assert why.startswith("one-row products over 4096-row layers stream 2,237.0 GB/s here, which reads its bytes "
                          "in 5.95 ms")
    assert "the other 12.9 ms of its 18.8 ms is not the weights' streaming at that rate; likely a fixed cost" in why
    # a CPU-like step near the kernels' rate: the kernels account for it
    why = R.step_shortfall(2.1 * GB, 0.14, 15 * GB, "one-row products")
    assert why.endswith("the kernels' streaming rate, below the read bandwidth, accounts for the step (140 ms, "
                        "1.00x that)")
    why = R.step_shortfall(3.78 * GB, 0.267, 16.97 * GB, "one-row products")    # 223 ms of 267: the rest is named
    assert why.endswith("accounts for the step (267 ms, 1.20x that; the other 44.3 ms: a fixed cost per step or the "
                        "machine's drift)")
    steady = R.step_shortfall(3.78 * GB, 0.267, 16.97 * GB, "one-row products", memory_steady=True)
    assert steady.endswith("(267 ms, 1.20x that; the other 44.3 ms: a fixed cost per step)")   # the read ruled it out
    assert "a machine running slower" not in R.step_shortfall(13.3 * GB, 18.8e-3, 2237 * GB, memory_steady=True)
    with pytest.raises(ValueError, match="stream_bw"):
        R.step_shortfall(1.0, 1.0, 0.0, "x")


def test_step_shortfall_names_a_rate_set_by_calls():
    GB = 1e9
    # the H200's eager step: a 4096-row bf16 call takes 23.1 us, 18.6 of it the call's fixed cost
    h200 = (23.1e-6, 18.6e-6)
    why = R.step_shortfall(13.28 * GB, 20.4e-3, 1451.7 * GB, per_call=h200)
    assert "(a 4096-row call takes 23.1 µs, a call on a small weight 18.6 µs" in why and "set by calls" in why
    assert "which overlap the kernel" in why and "is not those calls; likely a fixed cost per step" in why
    # replayed as a CUDA graph and slower than its products at one large matrix's rate: the GPU's own small
    # kernels, not Python or launches, which the graph removes
    replay = R.step_shortfall(13.28 * GB, 7.15e-3, 4405 * GB, "one-row products over one large matrix", graph=True)
    assert "many small kernels" in replay and "Python" not in replay and "launches" not in replay
    # the same step replayed as a CUDA graph, faster than those calls allow: the graph, not only drift
    graph = R.step_shortfall(13.28 * GB, 7.13e-3, 1451.7 * GB, per_call=h200)
    assert "took less than that: it paid less of that per-call cost (a CUDA graph" in graph
    # a CPU, where the fixed cost is a sliver of a call: the streaming wording, unchanged
    cpu = R.step_shortfall(2.1 * GB, 0.14, 15 * GB, "one-row products", per_call=(4.5e-3, 3.5e-6))
    assert cpu == R.step_shortfall(2.1 * GB, 0.14, 15 * GB, "one-row products")
    assert "fixed cost" not in cpu
