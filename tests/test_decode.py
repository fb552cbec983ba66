"""book.decode: streamed generation with timestamps, latency metrics, percentiles, SLOs, no-cache generation."""
from dataclasses import replace

import pytest
import torch

from book import decode as D
from book.llama import Llama
from book.models import architecture, build_random


@pytest.fixture(scope="module")
def model():
    tiny = replace(architecture("Llama-2-7B"), name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
                   head_dim=16, intermediate=128, vocab=97, max_context=64)
    return Llama.from_hf(build_random(tiny, dtype="fp32"))


def test_stream_yields_the_greedy_tokens_with_increasing_timestamps(model):
    prompt = torch.tensor([[5, 6, 7, 8]])
    want = model.generate(prompt, 10)[0].tolist()
    toks = list(D.stream(model, prompt, 10, decode=lambda i: f"<{i}>"))
    assert [t.id for t in toks] == want
    assert toks[0].text == f"<{want[0]}>"
    assert all(0 < a.t <= b.t for a, b in zip(toks, toks[1:]))


def test_stream_stops_at_eos_and_handles_zero_tokens(model):
    prompt = torch.tensor([5, 6, 7, 8])
    first = model.generate(prompt[None], 1)[0, 0].item()
    assert [t.id for t in D.stream(model, prompt, 10, eos_token_id=first)] == [first]
    assert list(D.stream(model, prompt, 0)) == []


def test_stream_rejects_bad_requests(model):
    with pytest.raises(ValueError, match="allows 64 tokens"):
        list(D.stream(model, torch.zeros(1, 60, dtype=torch.long), 10))
    with pytest.raises(ValueError, match="one request"):
        list(D.stream(model, torch.zeros(2, 3, dtype=torch.long), 2))
    with pytest.raises(ValueError, match=">= 0"):
        list(D.stream(model, torch.zeros(1, 3, dtype=torch.long), -1))


def test_sampling_with_a_seeded_generator_is_reproducible(model):
    prompt = torch.tensor([[1, 2, 3]])
    a = [t.id for t in D.stream(model, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(3))]
    b = [t.id for t in D.stream(model, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(3))]
    assert a == b


def test_latency_from_timestamps_by_hand():
    lat = D.Latency.from_times([0.5, 0.6, 0.7, 0.9])
    assert lat.n_tokens == 4 and lat.ttft == 0.5 and lat.e2e == 0.9
    assert lat.tpot == pytest.approx(0.4 / 3)
    assert lat.predicted_e2e() == pytest.approx(lat.e2e)
    one = D.Latency.from_times([0.3])
    assert (one.ttft, one.tpot, one.e2e) == (0.3, None, 0.3) and one.predicted_e2e() == 0.3
    none = D.Latency.from_times([])
    assert none == D.Latency(0, None, None, None) and none.predicted_e2e() is None
    with pytest.raises(ValueError, match="non-decreasing"):
        D.Latency.from_times([0.2, 0.1])
    toks = [D.Token(1, "a", 0.1), D.Token(2, "b", 0.3)]
    assert D.Latency.from_tokens(toks).tpot == pytest.approx(0.2)


def test_percentiles_match_numpy():
    import numpy as np
    vals = [0.9, 0.1, 0.5, 0.3, 0.7, 2.0, 0.2]
    for p in (0, 50, 95, 99, 100):
        assert D.percentile(vals, p) == pytest.approx(np.percentile(vals, p))
    with pytest.raises(ValueError, match="no values"):
        D.percentile([], 50)
    with pytest.raises(ValueError, match="0..100"):
        D.percentile([1.0], 101)


def test_summarize_skips_requests_without_a_value_and_slo_checks():
    lats = [D.Latency.from_times(t) for t in ([0.1, 0.2, 0.3], [0.2], [], [0.4, 0.45])]
    s = D.summarize(lats)
    assert s["ttft"][50] == pytest.approx(0.2) and len(s["tpot"]) == 3
    slo = D.SLO("test", ttft=0.35, tpot=0.08, p=50)
    res = slo.check(lats)
    assert res["ttft"] == (pytest.approx(0.2), 0.35, True)
    assert res["tpot"][2] is True                     # median of 0.1 and 0.05 is 0.075
    assert D.SLO("strict", ttft=0.01, tpot=0.01).check(lats)["ttft"][2] is False
    with pytest.raises(ValueError, match="no request"):
        slo.check([D.Latency.from_times([])])


def test_generation_without_a_cache_gives_the_same_tokens(model):
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(D.generate_no_cache(model, prompt, 12), model.generate(prompt, 12))


def test_teacher_forced_and_serial_steps_agree_on_the_last_logits(model):
    tokens = torch.tensor([[9, 8, 7, 6, 5, 4]])
    parallel = D.teacher_forced(model, tokens)()[:, -1]
    serial = D.serial_steps(model, tokens)()
    torch.testing.assert_close(parallel, serial, atol=1e-4, rtol=1e-4)


def test_median_gap():
    assert D.median_gap([0.0, 0.1, 0.3, 0.4]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        D.median_gap([1.0])


def test_prefills_and_decode_steps_timed_in_turn_for_both_decoders(model):
    hf = build_random(model.arch, dtype="fp32")
    pre = D.time_prefills({"HF": hf, "book": model}, [4, 12], rounds=2)
    dec = D.time_decode_steps({"HF": hf, "book": model}, [3, 20, 7], rounds=2, warmup=1)
    assert [len(pre[k]) for k in ("HF", "book")] == [2, 2] and [len(dec[k]) for k in ("HF", "book")] == [3, 3]
    assert all(len(t.times) == 2 and t.median > 0 for ts in (*pre.values(), *dec.values()) for t in ts)
    assert model.cache.max_len == 21                       # one cache, for the longest context and its step
    model.cache.seek(20)                                   # forward again, past an earlier step's position
    model.decode_step(torch.tensor([5]))
    assert model.cache.lengths.tolist() == [21]
    with pytest.raises(ValueError, match="0..20"):
        model.cache.seek(21)
    with pytest.raises(ValueError, match="positive whole"):
        D.time_decode_steps({"book": model}, [0, 4])
    with pytest.raises(ValueError, match="read_bytes"):
        D.time_decode_steps({"book": model}, [4], read_bytes=-1)
    probe = D.time_decode_steps({"book": model}, [4, 8], rounds=2, warmup=1, read_bytes=1 << 20)
    assert len(probe["book"]) == 2 and len(probe["read"].times) == 2      # the sum, timed in the same rounds
    with pytest.raises(ValueError, match="at least one"):
        D.time_prefills({}, [4])


def test_prefills_warm_every_length_where_asked(model, monkeypatch):
    lens = []
    real = D._prefill_fn

    def counting(m, n, batch):
        fn = real(m, n, batch)
        return lambda: (lens.append(n), fn())[1]

    monkeypatch.setattr(D, "_prefill_fn", counting)
    D.time_prefills({"book": model}, [4, 12], rounds=1, warmup=1)         # a CPU model: the shortest only
    assert sorted(lens) == [4, 4, 12]
    lens.clear()
    D.time_prefills({"book": model}, [4, 12], rounds=1, warmup=1, every_length=True)    # as on a GPU
    assert sorted(lens) == [4, 4, 12, 12]


def test_prefill_and_decode_timers_for_both_decoders(model):
    from transformers import DynamicCache
    hf = build_random(model.arch, dtype="fp32")
    for m in (hf, model):
        assert D.time_prefill(m, 16, repeats=2).median > 0
        assert D.time_decode_step(m, 10, repeats=2).median > 0
    with pytest.raises(ValueError, match="context >= 1"):
        D.time_decode_step(hf, 0)
    cache = DynamicCache(config=hf.config)
    hf(input_ids=torch.zeros(1, 10, dtype=torch.long), past_key_values=cache, use_cache=True)
    assert D.kv_cache_nbytes(cache) == 10 * model.arch.kv_bytes_per_token("fp32")
    model.setup_cache(1, 32)
    model.prefill(torch.zeros(1, 10, dtype=torch.long))
    assert D.kv_cache_nbytes(model.cache) == 10 * model.arch.kv_bytes_per_token("fp32")


def test_reference_suite_uses_the_read_bandwidth_and_the_fastest_precision_fp16_included(monkeypatch):
    from book import hardware, models
    from book.roofline import decode_step
    tiny = replace(architecture("Llama-2-7B"), name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
                   head_dim=16, intermediate=128, vocab=97, max_context=4096)
    # a device whose fastest matmul is fp16 (a T4-like GPU), with copy and read bandwidths far apart
    fake = hardware.Ceilings(device="fake", kind="cpu", read_bw=100e9, copy_bw=40e9,
                             matmul={"fp32": 1e12, "bf16": 2e12, "fp16": 3e12}, bytes_tested=1,
                             matmul_sizes={"fp32": 64, "bf16": 64, "fp16": 64})
    real_architecture = models.architecture
    monkeypatch.setattr(hardware, "measured_ceilings", lambda device=None: fake)
    monkeypatch.setattr(models, "architecture",
                        lambda name: tiny if name == "Llama-2-7B" else real_architecture(name))
    monkeypatch.setattr(models, "load", lambda name, dtype=None, device=None: build_random(tiny, dtype="fp32"))
    out = D.reference_suite("cpu")
    v = out["values"]
    assert v["fp16"] == 1.0 and v["dtype_bytes"] == 2.0 and v["read_bw_gbs"] == pytest.approx(100.0)
    floor = out["series"]["decode_floor_ms"]
    want = [decode_step(tiny.with_layers(4), 1, int(n), "fp16").bytes / fake.read_bw * 1e3 for n in floor["x"]]
    assert floor["y"] == pytest.approx(want)
    assert v["decode_1024_floor_ms"] == pytest.approx(want[2])
