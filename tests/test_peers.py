"""Hugging Face as the serving peer (chapter 04): its continuous batching manager and padded static `generate` give
every request the greedy tokens the book's decoder and HF `generate` give it alone; reports work without steps; bad
input is refused. No timed assertions: only the order of a request's own timestamps."""
import math

import pytest
import torch

from book.llama import Llama
from book import peers
from book.peers import hf_continuous, hf_continuous_unavailable, hf_static
from book.serve import Request, requests_from, table, workload

transformers = pytest.importorskip("transformers")

CB_WHY = hf_continuous_unavailable()      # None where this transformers has the API hf_continuous drives
needs_cb = pytest.mark.skipif(CB_WHY is not None, reason=CB_WHY or "")


def both(hf, reqs, cb: dict | None = None, st: dict | None = None) -> list:
    """hf_continuous (where this transformers has it) and hf_static on the same requests."""
    reps = [] if CB_WHY else [hf_continuous(hf, reqs, **(cb or {}))]
    return reps + [hf_static(hf, reqs, **(st or {}))]


@pytest.fixture(scope="module")
def hf():
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=None)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def reqs():
    return workload(10, vocab=96, prompt_median=12, output_median=8, sigma=0.8, max_len=64, seed=3)


def book_alone(model: Llama, reqs) -> list[list[int]]:
    return [model.generate(torch.tensor([r.prompt]), r.max_new_tokens)[0].tolist() for r in reqs]


def hf_alone(hf, reqs) -> list[list[int]]:
    """HF generate, one request at a time, never stopping early and with no logit changed."""
    out = []
    with torch.no_grad():
        for r in reqs:
            x = torch.tensor([r.prompt])
            y = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=r.max_new_tokens,
                            eos_token_id=None, pad_token_id=0)
            out.append(y[0, x.shape[1]:].tolist())
    return out


@pytest.fixture(scope="module")
def reference(hf, reqs):
    want = book_alone(Llama.from_hf(hf), reqs)
    assert hf_alone(hf, reqs) == want
    return want


def consistent(rep) -> None:
    """Every request's clock in order: arrives, leaves the queue, then its tokens one after another."""
    rep.check()
    for s in rep.finished:
        assert s.started is not None and s.started >= 0
        assert s.times[0] >= s.started and s.times == sorted(s.times)


@pytest.mark.parametrize("kw", [dict(), dict(max_batch=3, page_size=4, max_batch_tokens=8),
                                dict(scheduler="prefill_first", max_batch=4)],
                         ids=["default", "small-pages-chunked-prefill", "prefill-first"])
@needs_cb
def test_hf_continuous_tokens_equal_alone(hf, reqs, reference, kw):
    rep = hf_continuous(hf, reqs, **kw)
    consistent(rep)
    assert [s.tokens for s in rep.served] == reference
    assert rep.steps == [] and rep.name.startswith("HF continuous")


def test_hf_static_tokens_equal_alone_and_logs_its_steps(hf, reqs, reference):
    rep = hf_static(hf, reqs, batch=4)
    consistent(rep)
    assert [s.tokens for s in rep.served] == reference
    # three batches (4, 4, 2), each run to its longest request: one prefill step, then decode steps with padding
    batches = [reqs[:4], reqs[4:8], reqs[8:]]
    assert len(rep.steps) == sum(max(r.max_new_tokens for r in b) for b in batches)
    assert sum(1 for st in rep.steps if st.prefill) == 3 and 0 < rep.padding_share < 1
    for st in rep.steps:
        assert not set(st.decode) & set(st.padding) and st.end >= st.start
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from book.serve import gantt
    fig, ax = plt.subplots()
    gantt(ax, rep)
    plt.close(fig)


def test_end_of_sequence_ends_a_request_in_both(hf, reqs, reference):
    eos = reference[0][2]
    r = reqs[0]
    want = reference[0][:reference[0].index(eos) + 1]
    eos_reqs = [Request(r.prompt, r.max_new_tokens, eos_token_id=eos), reqs[1]]
    for rep in both(hf, eos_reqs, st=dict(batch=2)):
        consistent(rep)
        assert rep.served[0].tokens == want and rep.served[1].tokens == reference[1]


def test_arrivals_and_a_report_without_steps(hf):
    reqs = requests_from([(0.0, [3, 4, 5], 3), (0.05, [6, 7], 2), (0.05, [8, 9, 10, 11], 4)])
    for rep in both(hf, reqs, cb=dict(max_batch=2), st=dict(batch=2, timeout=0.01)):
        consistent(rep)
        row = rep.row()
        assert rep.wall > 0.05 and row["tokens/s"] > 0 and rep.generated == 9
        assert row["ttft p50 ms"] <= row["ttft p95 ms"] <= row["ttft p99 ms"]
        assert set(rep.percentiles()) >= {"ttft", "tpot", "queue"} and rep.latencies()
    if CB_WHY:
        return
    empty = hf_continuous(hf, reqs)
    assert math.isnan(empty.schedule_share) and empty.padding_share == 0.0 and math.isnan(empty.mean_batch)
    assert "HF continuous" in table([empty]) and "n/a" in table([empty], columns=("tokens/s", "mean batch"))


def test_too_long_requests_are_rejected_like_the_book(hf, reqs):
    mixed = [reqs[0], Request((5,) * 130, 4), Request((5,) * 100, 40)]
    for rep in both(hf, mixed):
        rep.check()
        assert [s.status for s in rep.served] == ["finished", "rejected", "rejected"]
        assert "prompt of 130" in rep.served[1].reason and "limit is 128" in rep.served[2].reason


@needs_cb
def test_an_eviction_is_reported_not_hidden(hf, reqs):
    with pytest.raises(RuntimeError, match="evicted"):
        hf_continuous(hf, reqs, max_batch=4, page_size=4, num_blocks=12)


@pytest.mark.parametrize("bad, err, msg", [
    (lambda hf, r: hf_continuous(hf, []), ValueError, "no requests"),
    (lambda hf, r: hf_static(hf, []), ValueError, "no requests"),
    (lambda hf, r: hf_static(hf, r, batch=0), ValueError, "batch"),
    (lambda hf, r: hf_static(hf, r, timeout=-1), ValueError, "timeout"),
    (lambda hf, r: hf_continuous(hf, r, max_batch=0), ValueError, "max_batch"),
    (lambda hf, r: hf_continuous(hf, r, page_size=2), ValueError, "page_size"),
    (lambda hf, r: hf_continuous(hf, r, num_blocks=0), ValueError, "num_blocks"),
    (lambda hf, r: hf_continuous(hf, r, scheduler="lifo"), ValueError, "unknown scheduler"),
    (lambda hf, r: hf_continuous(hf, [(1, 2, 3)]), TypeError, "not a book.serve.Request"),
    (lambda hf, r: hf_continuous(hf, [Request((4, 5), 3, temperature=0.7)]), NotImplementedError, "greedy"),
    (lambda hf, r: hf_static(hf, [Request((4, 5), 3, temperature=0.7)]), NotImplementedError, "greedy"),
])
def test_bad_input_is_refused_with_a_message(hf, reqs, bad, err, msg):
    with pytest.raises(err, match=msg):
        bad(hf, reqs)


def test_both_on_coder():
    from book.models import load
    hf = load("coder", dtype="fp32")
    reqs = workload(4, vocab=hf.config.vocab_size, prompt_median=24, output_median=12, max_len=128, seed=5)
    want = book_alone(Llama.from_hf(hf), reqs)
    assert hf_alone(hf, reqs) == want
    for rep in both(hf, reqs, cb=dict(max_batch=4), st=dict(batch=4)):
        consistent(rep)
        assert [s.tokens for s in rep.served] == want


def test_an_older_transformers_is_named_not_crashed_into(hf, reqs, monkeypatch):
    """transformers without the continuous-batching API (4.57, say) gets a sentence, not an ImportError."""
    assert (CB_WHY is None) == hasattr(transformers, "ContinuousBatchingConfig")
    monkeypatch.setattr(peers, "hf_continuous_unavailable", lambda: "transformers 4.57.6 has no ContinuousBatchingConfig")
    with pytest.raises(RuntimeError, match="4.57.6 has no ContinuousBatchingConfig"):
        hf_continuous(hf, reqs)


def test_hf_assisted_plain_with_an_assistant_and_with_prompt_lookup_gives_the_greedy_tokens(hf, reqs):
    """The chapter-05 peer in every mode, on this transformers (4.57's prompt lookup needs an end id: peers gives -1)."""
    from book.peers import hf_assisted
    prompts = [r.prompt + r.prompt[:4] for r in reqs[:3]]          # a repeat, so lookup finds something
    book = Llama.from_hf(hf)
    want = [book.generate(torch.tensor([p]), 10)[0].tolist() for p in prompts]
    for kw in (dict(), dict(assistant=hf, gamma=2), dict(lookup=3)):
        run = hf_assisted(hf, prompts, 10, **kw)
        assert run.tokens == want, kw
