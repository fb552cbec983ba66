"""The serving engine (chapter 04): every policy and cache gives each request the tokens the decoder gives it alone;
requests are accounted for; preemption, rejection, static batching, arrivals and bad input."""
import math
from dataclasses import replace

import pytest
import torch

from book.kvcache import PagedCache, Segment, SlotCache
from book.llama import Llama
from book.serve import Engine, Request, poisson_arrivals, requests_from, run_static, workload

transformers = pytest.importorskip("transformers")


def tiny(kv_heads: int = 2, seed: int = 0) -> Llama:
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=None)
    torch.manual_seed(seed)
    return Llama.from_hf(transformers.LlamaForCausalLM(cfg).eval())


class FakeClock:
    """Time that moves only when slept through, or by `tick` per reading: unit tests only."""

    def __init__(self, tick: float = 1e-3):
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def alone(model: Llama, reqs) -> list[list[int]]:
    return [model.generate(torch.tensor([r.prompt]), r.max_new_tokens)[0].tolist() for r in reqs]


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def reqs():
    return workload(10, vocab=96, prompt_median=12, output_median=8, sigma=0.8, max_len=64, seed=3)


@pytest.fixture(scope="module")
def reference(model, reqs):
    return alone(model, reqs)


CONFIGS = [dict(cache="slot"), dict(cache="paged"), dict(cache="paged", chunk=5), dict(cache="slot", chunk=3),
           dict(cache="paged", policy="prefill-first"), dict(cache="slot", policy="prefill-first", chunk=4),
           dict(cache="paged", block_size=4, max_batch=3), dict(cache="slot", policy="decode-first"),
           dict(cache="paged", policy="decode-first", chunk=4)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_engine_tokens_equal_decoder_alone(model, reqs, reference, cfg):
    rep = Engine(model, max_len=64, **{"max_batch": 4, **cfg}).run(reqs)
    rep.check()
    assert [s.tokens for s in rep.served] == reference
    assert max(len(s.prefill) + len(s.decode) for s in rep.steps) > 1          # requests really shared steps


def test_paged_preemption_recomputes_and_keeps_tokens(model, reqs, reference):
    e = Engine(model, cache="paged", kv_tokens=64, max_len=64, block_size=4, max_batch=6)
    rep = e.run(reqs)
    rep.check()
    assert rep.preemptions > 0
    assert [s.tokens for s in rep.served] == reference


def test_slot_reserves_max_len_paged_only_what_is_used(model):
    slot = SlotCache(2, 3, 2, 32, 16, dtype=torch.float32, device="cpu")
    paged = PagedCache(2, 24, 2, 4, 16, dtype=torch.float32, device="cpu")
    for c in (slot, paged):
        c.allocate(7, 5)
        c.allocate(7, 6)
    assert slot.reserved == 32 and paged.reserved == 8
    slot.free(7)
    paged.free(7)
    assert slot.reserved == 0 and paged.reserved == 0 and len(paged.free_blocks) == 24


def test_forward_packed_matches_prefill(model):
    x = torch.randint(3, 96, (1, 9), generator=torch.Generator().manual_seed(0))
    model.setup_cache(1, 16)
    want = model.prefill(x)
    for c in (SlotCache(2, 2, 2, 16, 16, dtype=torch.float32, device="cpu"),
              PagedCache(2, 8, 2, 4, 16, dtype=torch.float32, device="cpu")):
        c.allocate(0, 9)
        got = model.forward_packed(c.pack([Segment(0, tuple(x[0].tolist()), 0, True)]), c)
        assert torch.allclose(got, want, atol=1e-5)


def test_rejections_are_reported_and_nothing_lost(model):
    reqs = [Request((5,) * 10, 4), Request((5,) * 70, 4), Request((5,) * 10, 60), Request((6,) * 3, 2)]
    rep = Engine(model, cache="slot", max_len=64, max_batch=2).run(reqs)
    rep.check()
    assert [s.status for s in rep.served] == ["finished", "rejected", "rejected", "finished"]
    assert "prompt of 70" in rep.served[1].reason and "limit is 64" in rep.served[2].reason
    paged = Engine(model, cache="paged", kv_tokens=16, max_len=64, block_size=4).run([Request((5,) * 10, 8)])
    assert paged.served[0].status == "rejected" and "never fit" in paged.served[0].reason


def test_eos_ends_a_request_early(model, reqs, reference):
    r = reqs[0]
    eos = reference[0][2]
    rep = Engine(model, max_len=64).run([Request(r.prompt, r.max_new_tokens, eos_token_id=eos)])
    rep.check()
    assert rep.served[0].tokens == reference[0][:reference[0].index(eos) + 1]


def test_sampled_requests_are_seeded(model):
    reqs = [Request((4, 5, 6, 7), 6, temperature=1.0, seed=s) for s in (1, 2)]
    a = [s.tokens for s in Engine(model, max_len=64).run(reqs).served]
    b = [s.tokens for s in run_static(model, reqs, batch=2).served]
    assert a == b and a[0] != a[1]


def test_static_batching_pads_and_matches(model, reqs, reference):
    rep = run_static(model, reqs, batch=4)
    rep.check()
    assert [s.tokens for s in rep.served] == reference
    assert 0 < rep.padding_share < 1


def test_arrivals_in_real_time_with_queueing(model):
    clock = FakeClock()
    reqs = requests_from([(0.0, [3, 4, 5], 3), (5.0, [6, 7], 2), (5.0, [8, 9, 10, 11], 2)])
    rep = Engine(model, max_len=64).run(reqs, clock=clock, sleep=clock.sleep)
    rep.check()
    assert clock.t > 5.0                                        # it waited for the later arrivals
    for s in rep.served:
        lat = s.latency
        assert 0 <= s.started <= lat.ttft <= lat.e2e
    assert rep.steps[-1].start >= 5.0
    st = run_static(model, reqs, batch=2, timeout=0.5, clock=clock, sleep=clock.sleep)
    st.check()
    assert st.served[1].started <= st.served[2].started


def test_report_numbers(model, reqs):
    rep = Engine(model, max_len=64, max_batch=4).run(reqs)
    row = rep.row()
    assert row["tokens/s"] > 0 and 1 <= rep.mean_batch <= 4 and 0 <= rep.schedule_share < 1
    assert row["ttft p50 ms"] <= row["ttft p95 ms"] <= row["ttft p99 ms"]
    assert rep.generated == sum(r.max_new_tokens for r in reqs)


def test_poisson_arrivals():
    t = poisson_arrivals(50.0, 4000, seed=0)
    gaps = [b - a for a, b in zip([0.0] + t, t)]
    assert all(g > 0 for g in gaps) and math.isclose(sum(gaps) / len(gaps), 1 / 50, rel_tol=0.05)
    assert t == poisson_arrivals(50.0, 4000, seed=0) != poisson_arrivals(50.0, 4000, seed=1)


@pytest.mark.parametrize("bad, msg", [
    (lambda m: poisson_arrivals(0, 5), "positive"),
    (lambda m: poisson_arrivals(-2.0, 5), "positive"),
    (lambda m: Request((), 4), "empty prompt"),
    (lambda m: Request((1, 2), 0), "max_new_tokens"),
    (lambda m: Request((1, 2), 3, arrival=-1), "arrival"),
    (lambda m: Engine(m, cache="slot", kv_tokens=10, max_len=64), "smaller than one slot"),
    (lambda m: Engine(m, cache="paged", kv_tokens=3, block_size=4), "smaller than one block"),
    (lambda m: Engine(m, policy="shortest-first"), "unknown policy"),
    (lambda m: Engine(m, cache="ring"), "unknown cache"),
    (lambda m: Engine(m, max_len=1000), "longer than"),
    (lambda m: Engine(m, chunk=0), "chunk"),
    (lambda m: run_static(m, [Request((1,), 1)], batch=0), "batch"),
    (lambda m: Engine(m).run([]), "no requests"),
])
def test_bad_input_is_rejected_with_a_message(model, bad, msg):
    with pytest.raises(ValueError, match=msg):
        bad(model)


def test_engine_on_coder():
    from book.models import load
    coder = Llama.from_hf(load("coder", dtype="fp32"))
    reqs = workload(6, vocab=coder.arch.vocab, prompt_median=24, output_median=12, max_len=128, seed=5)
    want = alone(coder, reqs)
    for cfg in (dict(cache="paged", chunk=16), dict(cache="slot")):
        rep = Engine(coder, max_len=128, max_batch=4, **cfg).run(reqs)
        rep.check()
        assert [s.tokens for s in rep.served] == want
    from dataclasses import replace
    from book.serve import table
    lines = table([replace(rep, name="short")]).splitlines()    # a name shorter than the header's label
    assert len(lines[0]) == len(lines[1]) and lines[0].startswith("(latencies in ms)")


def test_decodes_of_very_different_lengths_attend_in_separate_groups(model):
    c = PagedCache(2, 64, 2, 4, 16, dtype=torch.float32, device="cpu")
    for seq, n in [(0, 10), (1, 12), (2, 11), (3, 120)]:
        c.allocate(seq, n + 1)
    p = c.pack([Segment(s, (5,), n, True) for s, n in [(3, 120), (0, 10), (1, 12), (2, 11)]])
    assert [(g.batch, g.kv_len) for g in p.groups] == [(3, 13), (1, 121)]
    assert [s.seq for s in p.segments] == [0, 2, 1, 3]
    similar = c.pack([Segment(s, (5,), n, True) for s, n in [(0, 10), (1, 12), (2, 11)]])
    assert [(g.batch, g.kv_len) for g in similar.groups] == [(3, 13)]


def test_step_policies_never_mix_what_they_keep_apart(model, reqs):
    for policy in ("prefill-first", "decode-first"):
        rep = Engine(model, max_len=64, max_batch=4, policy=policy).run(reqs)
        assert not any(s.prefill and s.decode for s in rep.steps), policy
    mixed = Engine(model, max_len=64, max_batch=4).run(reqs)
    assert any(s.prefill and s.decode for s in mixed.steps)


def test_saturated_batch_is_the_batch_while_requests_wait(model, reqs):
    # a slot cache of 3 slots with everything queued at once: while requests wait, 3 run (after the start)
    rep = Engine(model, cache="slot", kv_tokens=3 * 64, max_len=64, max_batch=8).run(reqs)
    assert all(s.waiting >= 0 for s in rep.steps)
    assert rep.saturated_batch == pytest.approx(3.0)
    assert rep.mean_batch < 3.0                                      # the tail, with the queue empty, runs fewer
    static = run_static(model, reqs, batch=4)
    assert math.isnan(static.saturated_batch)                        # static batching does not log its queue
    assert math.isnan(static.saturated_throughput)


def test_saturated_throughput_counts_the_tokens_ready_while_requests_wait():
    from book.serve import Report, Request, Served, Step
    served = [Served(Request((1,), 4, arrival=0.0), 0, tokens=[1] * 4, times=[0.5, 1.5, 2.5, 3.5]),
              Served(Request((1,), 2, arrival=1.0), 1, tokens=[1] * 2, times=[2.0, 5.0])]
    steps = [Step(float(t), t + 1.0, (), (0,), waiting=1 if t < 3 else 0) for t in range(6)]
    rep = Report("x", served, steps)
    # busy steps span 0..3 s; tokens ready then: 0.5, 1.5, 2.5 (request 0) and 3.0 (request 1): 4 in 3 s
    assert rep.saturated_throughput == pytest.approx(4 / 3)
    assert math.isnan(Report("x", served, [replace(s, waiting=0) for s in steps]).saturated_throughput)


# --- speculative decoding inside the engine (chapter 05) ---------------------------------------------------------

SPEC_CONFIGS = [dict(cache="paged"), dict(cache="slot"), dict(cache="paged", chunk=5, gamma=2),
                dict(cache="paged", block_size=4, max_batch=3, gamma=3), dict(cache="slot", policy="decode-first")]


@pytest.mark.parametrize("draft", ["lookup", "other", "self"])
@pytest.mark.parametrize("cfg", SPEC_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_speculative_engine_keeps_every_greedy_token(model, reqs, reference, cfg, draft):
    d = {"lookup": "lookup", "other": tiny(seed=1), "self": model}[draft]
    rep = Engine(model, max_len=64, draft=d, **{"max_batch": 4, **cfg}).run(reqs)
    rep.check()
    assert [s.tokens for s in rep.served] == reference
    assert sum(s.drafted for s in rep.steps) > 0
    if draft == "self":                               # the target as its own draft: every draft is accepted
        assert rep.acceptance == 1.0 and rep.tokens_per_decode > 2


def test_speculative_engine_survives_preemption(model, reqs, reference):
    e = Engine(model, cache="paged", kv_tokens=64, max_len=64, block_size=4, max_batch=6, draft=tiny(seed=1))
    rep = e.run(reqs)
    rep.check()
    assert rep.preemptions > 0
    assert [s.tokens for s in rep.served] == reference


def test_speculative_engine_samples_reproducibly_and_stops_at_eos(model, reqs, reference):
    sampled = [Request((4, 5, 6, 7), 12, temperature=1.0, seed=s) for s in (1, 2, 3)]
    runs = [[s.tokens for s in Engine(model, max_len=64, draft=d).run(sampled).served]
            for d in (tiny(seed=1), tiny(seed=1), "lookup")]
    assert runs[0] == runs[1] and all(len(t) == 12 for r in runs for t in r)
    r = reqs[0]
    eos = reference[0][2]
    rep = Engine(model, max_len=64, draft=model).run([Request(r.prompt, r.max_new_tokens, eos_token_id=eos)])
    rep.check()
    assert rep.served[0].tokens == reference[0][:reference[0].index(eos) + 1]


@pytest.mark.parametrize("bad, msg", [
    (lambda m: Engine(m, draft="medusa"), "unknown draft"),
    (lambda m: Engine(m, draft="lookup", gamma=0), "gamma"),
    (lambda m: Engine(m, draft=Llama.from_hf(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=128)).eval())), "vocabulary"),
])
def test_speculative_engine_rejects_bad_drafts(model, bad, msg):
    with pytest.raises(ValueError, match=msg):
        bad(model)


def test_speculative_engine_on_coder():
    from book.models import load
    coder = Llama.from_hf(load("coder", dtype="fp32"))
    small = Llama.from_hf(load("coder-draft", dtype="fp32"))
    reqs = workload(6, vocab=coder.arch.vocab, prompt_median=24, output_median=16, max_len=128, seed=5)
    want = alone(coder, reqs)
    rep = Engine(coder, max_len=128, max_batch=4, draft=small, gamma=3).run(reqs)
    rep.check()
    assert [s.tokens for s in rep.served] == want
    assert 0 < rep.acceptance < 1
