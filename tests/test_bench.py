"""Smoke tests of `python -m book.bench decode` on a tiny model: it runs, prints its lines and a SUMMARY last line.

No timed assertions: the figures are reported by the full benchmark, not checked here."""
import subprocess
import sys

import pytest

from book.bench import bench_decode, main


@pytest.fixture(autouse=True, scope="module")
def _one_round_ceilings():
    """The benchmarks read the ceilings a build measures once; these smoke tests check their lines, not the numbers,
    so one round of samples over small tensors stands in for a build's five (kept in memory: conftest sets
    BOOK_CEILINGS=off)."""
    from book import hardware
    with pytest.MonkeyPatch.context() as m:          # and 32 MiB tensors: lines to check, not numbers to publish
        m.setattr(hardware, "bandwidth_test_bytes", lambda dev=None: 32 * 2**20)
        hardware.measured_ceilings("cpu", rounds=1, refresh=True)


TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
        "--vocab", "256", "--prompt", "8", "--steps", "4", "--bw-bytes", str(16 * 2**20), "--device", "cpu",
        "--compile", "off"]


def test_decode_prints_every_figure_and_a_summary_last(capsys):
    assert main(["decode", *TINY]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    text = "\n".join(lines)
    for needle in ("bytes read per step", "ceilings (measured once", "matrix-vector ceiling", "one row of ",
                   "decode path: eager PyTorch", "sampled beside every step", "book decode step",
                   "HF   generate step", "MBU", "of the matrix-vector sample beside it", "book/HF tokens/s",
                   "greedy tokens equal for the first 4 of 4"):
        assert needle in text, needle
    last = lines[-1]
    # the precision whose one-row products stream the most weights per second here, chosen and said so
    from book.hardware import measured_ceilings
    chosen = measured_ceilings("cpu").decode_dtype()
    assert f"batch-1 decode precision: {chosen}," in text and "chosen (--dtype picks another)" in text
    assert last.startswith(f"SUMMARY device=cpu dtype={chosen} ")
    for field in ("MBU(book)=", "MBU(HF)=", "of_matvec(book)=", "path=eager-", "book/HF tokens/s=", "bytes/step="):
        assert field in last


def test_decode_result_and_no_hf(capsys):
    r = bench_decode("Llama-2-7B", layers=1, dtype="fp32", prompt=4, steps=3, device="cpu", hf=False, compile="off",
                     bw_bytes=8 * 2**20, hidden=32, n_heads=2, n_kv_heads=1, intermediate=64, vocab=128)
    assert r.hf is None and r.speedup is None and r.mbu_book > 0 and r.mbu_mv_book > 0 and r.matvec_bw > 0
    assert len(r.book.times) == 3 and r.bytes_per_step == pytest.approx(r.weight_bytes + r.kv_bytes)
    assert len(r.sum_samples) == 3 and all(b >= s for b, s in zip(r.bw_samples, r.sum_samples))   # max(sum, mv)
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("book/HF tokens/s=n/a")


def test_a_parting_of_greedy_tokens_is_called_a_near_tie_only_within_the_decoders_difference():
    from book.bench import tie_text
    near = tie_text(28, 0.01, 0.03)
    assert "at step 28" in near and "0.01 apart, within the 0.03" in near and "near tie" in near
    assert "tied (0 apart)" in tie_text(15, 0.0, 0.02)
    far = tie_text(5, 0.5, 0.03)
    assert "more than the 0.03" in far and "beyond rounding" in far and "near tie" not in far


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown dtype"):
        bench_decode(dtype="int3", device="cpu")
    with pytest.raises(ValueError, match="steps >= 2"):
        bench_decode(steps=1, device="cpu", hidden=32, n_heads=2)
    with pytest.raises(SystemExit):
        main(["decode", "--dtype", "int3"])


def test_module_entry_point_help():
    done = subprocess.run([sys.executable, "-m", "book.bench", "decode", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "--compile" in done.stdout and "--layers" in done.stdout


def test_a_failing_compile_falls_back_to_the_plain_step(monkeypatch, capsys):
    import torch

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler on this device (forced by the test)")
    monkeypatch.setattr(torch, "compile", broken)
    r = bench_decode("Llama-2-7B", layers=1, dtype="fp32", prompt=4, steps=3, device="cpu", hf=False,
                     compile="auto", bw_bytes=8 * 2**20, hidden=32, n_heads=2, n_kv_heads=1, intermediate=64,
                     vocab=128)
    captured = capsys.readouterr()
    assert "torch.compile failed here" in r.path and "path=eager-" in captured.out.splitlines()[-1]
    assert "note: torch.compile is not available here" in captured.err


def test_a_compiled_step_that_fails_when_run_falls_back(capsys):
    import torch
    from book.llama import Llama
    from book.models import architecture
    a = architecture("Llama-2-7B").with_layers(1)
    from dataclasses import replace
    a = replace(a, hidden=32, n_heads=2, n_kv_heads=1, head_dim=16, intermediate=64, vocab=128)
    m = Llama(a, dtype="fp32", device="cpu")
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randint(0, 128, (1, 5))
    want = m.generate(x, 4)

    def fails(*args):
        raise RuntimeError("CUDA graphs are not supported here (forced by the test)")
    m.setup_cache(1, 16)
    m.compile_decode()
    m._compiled = fails
    assert torch.equal(m.generate(x, 4), want) and m._compiled is None
    assert "the compiled decode step failed on this device" in capsys.readouterr().err


def test_eager_and_compiled_steps_are_timed_in_turn(capsys):
    import math
    import torch
    from dataclasses import replace
    from book.bench import _paired_step_ms
    from book.llama import Llama
    from book.models import architecture
    a = replace(architecture("Llama-2-7B").with_layers(1), hidden=32, n_heads=2, n_kv_heads=1, head_dim=16,
                intermediate=64, vocab=128)
    m = Llama(a, dtype="fp32", device="cpu")
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randint(0, 128, (1, 5))
    m.setup_cache(1, 32)
    m.compile_decode(bucket=32)
    order = []

    def fake(*args):                        # stands in for the compiled step: the eager one, counted
        order.append("compiled")
        return m._decode(*args)
    m._compiled = fake
    eager_ms, compiled_ms = _paired_step_ms(m, x, torch.device("cpu"), n=3)
    assert order == ["compiled"] * 3 and m._compiled is fake and eager_ms > 0 and compiled_ms > 0

    def fails(*args):
        raise RuntimeError("forced by the test")
    m._compiled = fails
    eager_ms, compiled_ms = _paired_step_ms(m, x, torch.device("cpu"), n=3)
    assert m._compiled is None and math.isfinite(eager_ms)       # fell back once, then stayed off
    assert "the compiled decode step failed" in capsys.readouterr().err
    m._compiled = None
    assert _paired_step_ms(m, x, torch.device("cpu"), n=2)[1] == float("inf")


# ------------------------------------------------------------------------------------------- python -m book.bench serve

from book.peers import hf_continuous_unavailable  # noqa: E402

CB_WHY = hf_continuous_unavailable()      # None where this transformers has the API the benchmark compares with
needs_cb = pytest.mark.skipif(CB_WHY is not None, reason=CB_WHY or "")

SERVERS = ("book static (batch 3)", "book continuous (slot cache)", "book continuous (paged cache)",
           "HF continuous (paged)", "HF static (batch 3, padded)")


@pytest.fixture(scope="module")
def tiny_llama_folder(tmp_path_factory):
    """A tiny random transformers Llama saved to a folder, so the serving benchmark runs in seconds."""
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path)
    return str(path)


@needs_cb
def test_serve_prints_every_run_and_a_summary_last(capsys, tiny_llama_folder):
    assert main(["serve", "--requests", "6", "--max-batch", "3", "--device", "cpu",
                 "--model-path", tiny_llama_folder]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    text = "\n".join(lines)
    for needle in ("device: cpu", "kernels (chosen by the build's measured ceilings): one row via",
                   "workload: 6 requests", "prompt median 48", "output median 32", "warm-up",
                   "phase (a): all 6 requests", "phase (b): the same requests arriving as a Poisson process",
                   "0.75 x the capacity measured in (a)", "TTFT p50/p95/p99 ms", "TPOT p50/p95/p99 ms", "sched/step",
                   "(a) book continuous (paged) / HF continuous tokens/s",
                   "(b) book continuous (paged) / HF continuous tokens/s", "book continuous (paged) / book static",
                   "check: greedy tokens equal"):
        assert needle in text, needle
    for server in SERVERS:
        assert sum(line.lstrip().startswith(server) for line in lines) == 2, server      # one row in each phase
    last = lines[-1]
    assert last.startswith("SUMMARY device=cpu dtype=fp32 model=tiny-llama")
    for field in ("requests=6", "max_batch=3", "(measured)", "book_paged/HF_cb(a)=", "book_paged/HF_cb(b)=",
                  "book_cont/book_static(b)=", "ttft_p95_static/cont(b)=", "tokens_equal=60/60"):
        assert field in last, field


@needs_cb
def test_serve_result_with_a_given_rate(capsys, tiny_llama_folder):
    from book.bench import bench_serve
    r = bench_serve(tiny_llama_folder, requests=3, rate=40.0, max_batch=2, device="cpu")
    assert r.rate == 40.0 and not r.rate_measured and r.requests == 3 and r.capacity > 0
    assert len(r.runs) == 10 and all(run.tokens_equal == 3 and run.tokens_per_s > 0 for run in r.runs)
    assert r.run("b", "HF continuous (paged)").schedule_share is None
    assert r.run("a", "book continuous (paged cache)").schedule_share is not None
    out = capsys.readouterr().out
    assert "(given; " in out and out.strip().splitlines()[-1].count("(given)") == 1


def test_serve_bad_arguments():
    from book.bench import bench_serve
    for kw, msg in ((dict(requests=0), "requests"), (dict(max_batch=0), "max_batch"), (dict(rate=-1.0), "rate"),
                    (dict(dtype="int3"), "unknown dtype")):
        with pytest.raises(ValueError, match=msg):
            bench_serve(**kw)
    with pytest.raises(SystemExit):
        main(["serve", "--requests", "many"])


def test_serve_names_an_older_transformers(capsys, monkeypatch):
    import book.peers
    monkeypatch.setattr(book.peers, "hf_continuous_unavailable", lambda: "transformers 4.57.6 has no X")
    with pytest.raises(SystemExit) as e:
        main(["serve", "--requests", "3"])
    assert e.value.code == 2 and "transformers 4.57.6 has no X" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="4.57.6 has no X"):
        from book.bench import bench_serve
        bench_serve(requests=3)


def test_speculative_prints_the_sweep_the_peers_and_a_summary_last(capsys):
    assert main(["speculative", "--prompts", "2", "--new-tokens", "12", "--gammas", "1,3", "--device", "cpu",
                 "--sampling-eps", "0.5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    text = "\n".join(lines)
    for needle in ("device: cpu", "2-32 rows via", "workload: 2 held-out prompts of 64 tokens", "greedy alpha", "c = ",
                   "k=2:", "k=4:", "formula", "HF generate:", "HF assisted (gamma", "HF prompt lookup",
                   "book / HF assisted at the same gamma", "HF assisted sampling (T=1, one drafted token)"):
        assert needle in text, needle
    last = lines[-1]
    assert last.startswith("SUMMARY device=cpu dtype=fp32")
    for field in ("alpha=", "c=", "best_gamma=", "formula=", "worst_gap=", "book/HF_assisted=", "identical=8/8", "HF_sampling=pass"):
        assert field in last, field


def test_speculative_bad_arguments():
    from book.bench import bench_speculative
    for kw, msg in ((dict(gammas=(0,)), "gammas"), (dict(prompts=0), "prompts"), (dict(dtype="int3"), "dtype"),
                    (dict(new_tokens=500), "context"), (dict(sampling_eps=1.5), "sampling_eps")):
        with pytest.raises(ValueError, match=msg):
            bench_speculative(**kw, hf=False)
    with pytest.raises(SystemExit):
        main(["speculative", "--gammas", "one"])
