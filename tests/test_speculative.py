"""book.speculative: windows, the loop detector and acceptance rates on tiny random models (appendix A)."""
import math

import pytest
import torch

from book import speculative


def test_tail_loop_finds_a_repeated_line():
    head = list(range(100, 110))
    cycle = [1, 2, 3, 4, 5]
    p, covered = speculative.tail_loop(head + cycle * 4 + cycle[:2])
    assert p == 5 and covered == 22


def test_tail_loop_period_one_and_tensor_input():
    assert speculative.tail_loop(torch.tensor([7, 8] + [0] * 20)) == (1, 20)


def test_tail_loop_none_when_no_repeat_or_too_short():
    assert speculative.tail_loop(list(range(64))) == (0, 0)
    assert speculative.tail_loop(list(range(20)) + [1, 2, 1, 2]) == (0, 0)   # covers 4 < 12
    assert speculative.tail_loop(list(range(20)) + [1, 2, 1, 2], min_tokens=4) == (2, 4)
    assert speculative.tail_loop([]) == (0, 0)
    with pytest.raises(ValueError):
        speculative.tail_loop([1, 1], min_tokens=1)


def test_tail_loop_needs_two_full_copies():
    # 0..9 then 0..4: the last 5 repeat tokens 10 back, but one copy and a half is not a loop
    assert speculative.tail_loop(list(range(10)) + list(range(5)), min_tokens=2) == (0, 0)


def test_windows_shapes_and_errors():
    w = speculative.windows(torch.arange(100), 10, max_windows=3)
    assert w.shape == (3, 10) and int(w[2, 0]) == 20
    spread = speculative.windows(torch.arange(100), 10, max_windows=3, spread=True)
    assert spread[:, 0].tolist() == [0, 40, 90]           # the first, a middle and the last of the ten
    assert speculative.windows(torch.arange(100), 10, max_windows=30, spread=True).shape == (10, 10)
    with pytest.raises(ValueError):
        speculative.windows(torch.arange(5), 10)
    with pytest.raises(ValueError):
        speculative.windows(torch.zeros(2, 5), 2)
    with pytest.raises(ValueError, match="max_windows"):
        speculative.windows(torch.arange(100), 10, max_windows=0)


class _Toy(torch.nn.Module):
    """A 'model' whose logits depend only on the current token: a fixed table."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, tokens):
        return self.table[tokens]


def test_acceptance_identical_models_accept_everything():
    torch.manual_seed(0)
    m = _Toy(torch.randn(16, 16))
    x = torch.randint(0, 16, (4, 12))
    a = speculative.acceptance_rates(m, m, x, temperatures=(0.5, 1.0))
    assert a["greedy"] == 1.0 and a["positions"] == 48
    assert all(abs(v - 1.0) < 1e-5 for v in a["sampled"].values())


def test_acceptance_greedy_share_per_row_and_its_standard_error():
    t = torch.eye(4) * 5                      # the target's top token after token i is i
    d = t.clone()
    d[2:] = torch.eye(4)[[3, 2]] * 5          # the draft agrees after tokens 0 and 1 only
    x = torch.tensor([[0, 1, 0, 1], [2, 3, 2, 3]])
    a = speculative.acceptance_rates(_Toy(t), _Toy(d), x)
    assert a["greedy_rows"] == [1.0, 0.0] and a["greedy"] == 0.5
    assert a["greedy_se"] == pytest.approx(0.5)                  # stdev 0.707 over sqrt(2) rows


def test_acceptance_sampled_is_overlap_of_distributions():
    t, d = torch.zeros(4, 4), torch.zeros(4, 4)
    t[:, 0], d[:, 1] = 50.0, 50.0          # both sure, and of different tokens
    a = speculative.acceptance_rates(_Toy(t), _Toy(d), torch.zeros(1, 3, dtype=torch.long), skip=1)
    assert a["greedy"] == 0.0 and a["positions"] == 2
    assert a["greedy_rows"] == [0.0] and math.isnan(a["greedy_se"])       # one row: no spread to measure
    assert a["sampled"][1.0] < 1e-6
    with pytest.raises(ValueError):
        speculative.acceptance_rates(_Toy(t), _Toy(d), torch.zeros(1, 3, dtype=torch.long), temperatures=(0,))


# ------------------------------------------------------------------------------------------------ chapter 05

transformers = pytest.importorskip("transformers")


def tiny(seed: int = 0, sharp: float = 1.0):
    from book.llama import Llama
    return Llama.from_hf(tiny_hf(seed, sharp))


def tiny_hf(seed: int = 0, sharp: float = 1.0):
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(sharp)                  # sharper next-token distributions than a random init gives
    return hf


@pytest.fixture(scope="module")
def pair():
    return tiny(0, sharp=12.0), tiny(1, sharp=12.0)


PROMPTS = [[5, 9, 11, 3], [7], [4, 4, 4, 8, 9, 4, 4, 4, 8], list(range(10, 30))]


def test_verify_greedy_keeps_the_agreeing_prefix_and_adds_the_targets_token():
    p = torch.full((4, 6), -5.0)
    for i, best in enumerate([2, 3, 1, 5]):
        p[i, best] = 5.0
    assert speculative.verify(p, None, [2, 3, 4], temperature=0) == (2, 1)      # third draft differs: target's 1
    assert speculative.verify(p, None, [2, 3, 1], temperature=0) == (3, 5)      # all kept, bonus from the last row
    assert speculative.verify(p[:1], None, [], temperature=0) == (0, 2)          # nothing drafted: a plain step


@pytest.mark.parametrize("draft", ["same", "other", "lookup"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_speculative_equals_target_greedy(pair, draft, gamma):
    target, other = pair
    d = {"same": lambda: speculative.ModelDraft(tiny(0, sharp=12.0)), "other": lambda: speculative.ModelDraft(other),
         "lookup": lambda: speculative.PromptLookup(3)}[draft]()
    for prompt in PROMPTS:
        want = target.generate([prompt], 20)[0].tolist()
        run = speculative.generate(target, d, prompt, 20, gamma=gamma)
        assert run.tokens == want, (draft, gamma, prompt)
        assert run.target_calls == len(run.rounds) + 1
        if draft == "same":                        # a draft that is the target is always right
            assert run.accepted == run.proposed and run.tokens_per_call > 1


def test_speculative_stops_at_eos_and_counts_calls(pair):
    target, other = pair
    want = target.generate([PROMPTS[0]], 12)[0].tolist()
    eos = want[5]
    run = speculative.generate(target, speculative.ModelDraft(other), PROMPTS[0], 12, gamma=4, eos_token_id=eos)
    assert run.tokens == want[:want.index(eos) + 1]
    assert run.draft_calls >= sum(1 for r in run.rounds if r.proposed)


def test_prompt_lookup_proposes_what_followed_the_last_match():
    d = speculative.PromptLookup(ngram=2)
    d.start([1, 2, 3, 4, 9, 1, 2], 32)
    assert d.propose(3, 0.0, None) == ([3, 4, 9], None)
    d.accept([7])                                   # "2 7" never occurred; "7" neither: nothing to propose
    assert d.propose(3, 0.0, None) == ([], None)


TOY_P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
TOY_Q = torch.tensor([0.10, 0.10, 0.40, 0.30, 0.05, 0.05], dtype=torch.float64)


@pytest.mark.parametrize("residual,ratio,exact", [(True, True, True), (False, True, False), (True, False, False)])
def test_speculative_sampling_is_exact_and_the_test_catches_broken_variants(residual, ratio, exact):
    eps = 0.06
    bad = speculative.output_distribution(TOY_P, TOY_Q, residual=residual, ratio=ratio)
    assert (speculative.tv_distance(bad, TOY_P) < 1e-12) == exact
    if not exact:
        assert speculative.tv_distance(bad, TOY_P) >= eps             # the broken variants are detectable at eps
    n = speculative.tv_samples_needed(len(TOY_P) + 1, eps)
    g = torch.Generator().manual_seed(0)
    p2 = torch.stack([TOY_P, TOY_P]).float()
    out = []
    for _ in range(n):
        x = int(torch.multinomial(TOY_Q.float(), 1, generator=g))
        kept, nxt = speculative.verify(p2, TOY_Q.float()[None], [x], temperature=1.0, generator=g,
                                       residual=residual, ratio=ratio)
        out.append(x if kept else nxt)                # the token at the drafted position
    res = speculative.tv_test(out, TOY_P, eps=eps)
    assert res["powered"] and res["passed"] == exact, res


def test_sampled_generate_has_the_targets_distribution(pair):
    target, other = pair
    prompt = [5, 9, 11, 3]
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt]))[0, -1].double(), -1)
        ctx = torch.tensor([prompt + [t] for t in range(48)])
        p2 = (p1[:, None] * torch.softmax(target(ctx)[:, -1].double(), -1)).sum(0)   # the second token's marginal
    eps = 0.2                                       # detects any TV gap of 0.2 or more (the toy test: 0.06)
    n = speculative.tv_samples_needed(int((p2 >= eps / 64).sum()) + 1, eps)
    g = torch.Generator().manual_seed(1)
    d = speculative.ModelDraft(other)
    second = [speculative.generate(target, d, prompt, 3, gamma=2, temperature=1.0, generator=g).tokens[1]
              for _ in range(n)]
    res = speculative.tv_test(second, p2, eps=eps)
    assert res["powered"] and res["passed"], res


def test_formula_and_bad_input(pair):
    assert speculative.expected_tokens(0.0, 4) == 1.0
    assert speculative.expected_tokens(1.0, 4) == 5.0
    assert speculative.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert speculative.predicted_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert speculative.predicted_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 1.2)
    assert speculative.best_gamma(0.9, 0.01) > speculative.best_gamma(0.5, 0.2)
    assert speculative.best_gamma(0.9, 0.01) == 24          # above the old cap of 16, which it returned silently
    target, other = pair
    d = speculative.ModelDraft(other)
    for kw, msg in [(dict(gamma=0), "gamma"), (dict(temperature=-1.0), "temperature"),
                    (dict(max_new_tokens=0), "max_new_tokens")]:
        with pytest.raises(ValueError, match=msg):
            speculative.generate(target, d, [1, 2], **{"max_new_tokens": 4, **kw})
    with pytest.raises(ValueError, match="empty"):
        speculative.generate(target, d, [], 4)
    with pytest.raises(ValueError, match="allows 96"):
        speculative.generate(target, d, list(range(90)), 10)
    from book.llama import Llama
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=96)
    odd = Llama.from_hf(transformers.LlamaForCausalLM(cfg).eval())
    with pytest.raises(ValueError, match="vocabulary"):
        speculative.generate(target, speculative.ModelDraft(odd), [1, 2], 4)
    with pytest.raises(ValueError, match="alpha"):
        speculative.expected_tokens(1.5, 2)


def test_compare_times_plain_and_every_draft_and_gamma_on_the_same_prompts(pair):
    target, other = pair
    drafts = {"model": speculative.ModelDraft(other), "lookup": speculative.PromptLookup(2)}
    cmp = speculative.compare(target, drafts, PROMPTS[:3], 10, (1, 3))
    assert cmp.reference == [target.generate([p], 10)[0].tolist() for p in PROMPTS[:3]]
    assert cmp.step_s > 0 and cmp.speedup("model", 3) > 0
    for name in drafts:
        for g in (1, 3):
            pt = cmp.point(name, g)
            assert pt.identical == 3 and pt.tokens == 30 and pt.target_calls == sum(r.target_calls for r in pt.runs)
    m = cmp.point("model", 3)
    assert m.draft_call_s > 0 and m.verify_s > 0 and 0 <= m.alpha <= 1
    with pytest.raises(KeyError, match="gamma 2"):
        cmp.point("model", 2)
    with pytest.raises(ValueError):
        speculative.compare(target, {}, PROMPTS, 4, (1,))


def test_timeline_draws_the_rounds(pair):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    target, other = pair
    run = speculative.generate(target, speculative.ModelDraft(other), PROMPTS[0], 12, gamma=3)
    fig, axes = plt.subplots(2, 1)
    speculative.timeline(axes, run, rounds=4)
    assert len(axes[1].patches) == 3 * min(4, len(run.rounds))
    plt.close(fig)
    with pytest.raises(ValueError, match="no draft"):
        speculative.timeline(axes, speculative.Run([1]))


def test_output_distribution_by_hand():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.2, 0.6])
    torch.testing.assert_close(speculative.output_distribution(p, q), p)
    # no residual: accepted min(p, q) = [.2, .2, .2], then the rejected 0.4 of the mass redrawn from p
    torch.testing.assert_close(speculative.output_distribution(p, q, residual=False),
                               torch.tensor([0.2 + 0.4 * 0.5, 0.2 + 0.4 * 0.3, 0.2 + 0.4 * 0.2]))
    # no ratio: token 2 (q > p) is always rejected, the others always kept; 0.6 redrawn from (p - q)+ = [.3, .1, 0]
    torch.testing.assert_close(speculative.output_distribution(p, q, ratio=False),
                               torch.tensor([0.2 + 0.6 * 0.75, 0.2 + 0.6 * 0.25, 0.0]))


def test_hf_assisted_sampling_passes_the_same_test():
    from book.peers import hf_sampling_test
    hf_t, hf_d = tiny_hf(0, sharp=12.0), tiny_hf(1, sharp=12.0)
    r = hf_sampling_test(hf_t, hf_d, [5, 9, 11, 3], eps=0.3)
    t = r["test"]
    assert t["powered"] and t["passed"], t
    assert r["speculative_calls"] == t["samples"]                 # every draw went through the acceptance rule
    assert set(r["broken_tv"]) == {"no residual", "no ratio"}
    with pytest.raises(ValueError, match="temperature"):
        hf_sampling_test(hf_t, hf_d, [5, 9], temperature=0)


def test_tokens_per_round_counts_full_rounds_only_as_the_formula_does():
    spec = speculative
    full = [spec.Round(0, 0, 0, [1, 2, 3], a, 9) for a in (3, 0, 1)]   # 4, 1 and 2 tokens
    short = spec.Round(0, 0, 0, [1], 1, 9)                             # cut by the token limit
    run = spec.Run(tokens=list(range(8)), rounds=full + [short], gamma=3)
    p = spec.GammaPoint(3, 1.0, 8, 5, 4, 0.5, 0, [run])
    assert p.tokens_per_round == pytest.approx(7 / 3)
    assert p.tokens_per_call == pytest.approx(8 / 5)     # the prefill's pass and token included
    assert math.isnan(spec.GammaPoint(3, 1.0, 1, 1, 0, 0.5, 0, [spec.Run([0], [short], 3)]).tokens_per_round)


def test_step_costs_time_every_call_in_turn_and_leave_the_context_put(pair):
    target, draft = pair
    costs = speculative.step_costs(target, draft, PROMPTS[3], ks=(1, 3), repeats=3)
    assert costs.context == 20 and set(costs.verify) == {1, 3}
    assert costs.target_step > 0 and costs.c > 0 and costs.v(3) > 0
    assert target.cache.lengths.tolist() == [20] and draft.cache.lengths.tolist() == [20]   # rewound each call
    alone = speculative.step_costs(target, None, PROMPTS[3], ks=(2,), repeats=2)
    assert math.isnan(alone.draft_step)
    with pytest.raises(KeyError, match="timed: \\[2\\]"):
        alone.v(5)


def test_pooled_tv_pools_rare_outcomes_and_never_exceeds_the_full_distance():
    p = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05])
    a = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0])            # differs only among the two rare outcomes
    assert speculative.tv_distance(a, p) == pytest.approx(0.05)
    assert speculative.pooled_tv(a, p, 0.08) == pytest.approx(0.0)           # pooled: the test cannot see it
    assert speculative.pooled_tv(a, p, 0.01) == pytest.approx(0.05)          # nothing pooled: the full distance
