"""Jacobi and lookahead decoding (chapter 06): the fixed point is the greedy output, on random models and on coder;
the iteration converges within n passes; as drafts they keep speculative decoding exact; bad input is refused."""
import pytest
import torch

from book import speculative as spec
from book.llama import Llama
from book.models import architecture, build_random
from book.parallel import JacobiDraft, LookaheadDraft, jacobi_block


@pytest.fixture(scope="module")
def model():
    arch = architecture("Llama-2-7B")
    from dataclasses import replace
    small = replace(arch, name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16,
                    intermediate=128, vocab=97, max_context=256)
    torch.manual_seed(0)
    return Llama.from_hf(build_random(small, dtype="fp32"))


def greedy(model, prompt, n):
    return model.generate(torch.tensor([prompt]), n)[0].tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 5, 16])
def test_the_fixed_point_is_the_greedy_output(model, seed, n):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 97, (12,), generator=g).tolist()
    want = greedy(model, prompt, n + 1)
    block = jacobi_block(model, prompt, n)
    assert [block.first, *block.tokens] == want
    assert block.converged_after <= n and block.passes <= n + 1
    assert block.trajectory[-1] == block.tokens and 1 <= block.tokens_per_pass <= n
    # after pass i the first i guesses are exact: Jacobi never does worse than one token per pass
    for i, guesses in enumerate(block.trajectory, start=1):
        assert guesses[:i] == block.tokens[:i]


def test_a_perfect_guess_converges_in_one_pass_and_max_passes_stops_early(model):
    prompt = list(range(3, 15))
    want = greedy(model, prompt, 9)
    block = jacobi_block(model, prompt, 8, init=want[1:])
    assert block.passes == 1 and block.converged_after == 1 and block.tokens_per_pass == 8
    capped = jacobi_block(model, prompt, 8, max_passes=1)
    assert capped.passes == 1 and capped.tokens[:1] == want[1:2]


@pytest.mark.parametrize("draft", [JacobiDraft, lambda: LookaheadDraft(ngram=3)], ids=["jacobi", "lookahead"])
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_as_a_draft_speculative_decoding_stays_exact(model, draft, gamma):
    prompt = [5, 6, 7, 8] * 4                   # repetitive, so the pool has something to find
    want = greedy(model, prompt, 40)
    run = spec.generate(model, draft(), prompt, 40, gamma=gamma)
    assert run.tokens == want
    assert run.target_calls <= 40 and run.tokens_per_call >= 1
    assert all(len(r.proposed) <= gamma for r in run.rounds)


def counter(vocab: int = 11) -> Llama:
    """A model whose greedy text counts: after token t comes t + 1 (mod vocab), whatever came before (its layer adds
    nothing to the residual; one-hot embeddings; a head that maps t to t + 1)."""
    from dataclasses import replace
    arch = replace(architecture("Llama-2-7B"), name="counter", n_layers=1, hidden=16, n_heads=2, n_kv_heads=2,
                   head_dim=8, intermediate=32, vocab=vocab, max_context=256)
    m = Llama.from_hf(build_random(arch, dtype="fp32"))
    with torch.no_grad():
        m.blocks[0].wo.zero_()
        m.blocks[0].w_down.zero_()
        m.embed.zero_()
        m.lm_head.zero_()
        for t in range(vocab):
            m.embed[t, t] = 1.0
            m.lm_head[(t + 1) % vocab, t] = 1.0
    return m


def test_lookahead_finds_the_pattern_that_jacobi_alone_does_not():
    """On the counter, Jacobi guesses are always one step behind (a pass moves one token), so plain Jacobi gets
    about one token a pass; the diagonals of its trajectory are the counter's true n-grams, so lookahead reads the
    text off its pool."""
    m = counter()
    want = [(3 + i) % 11 for i in range(1, 61)]
    plain = spec.generate(m, JacobiDraft(), [1, 2, 3], 60, gamma=6)
    d = LookaheadDraft(ngram=3)
    look = spec.generate(m, d, [1, 2, 3], 60, gamma=6)
    assert plain.tokens == want and look.tokens == want
    assert plain.tokens_per_call < 2.5
    assert d.from_pool > 0 and look.tokens_per_call > 2 * plain.tokens_per_call


def test_bad_input_is_refused(model):
    with pytest.raises(ValueError, match="empty"):
        jacobi_block(model, [], 4)
    with pytest.raises(ValueError, match="n \\(tokens in the block\\)"):
        jacobi_block(model, [1, 2], 0)
    with pytest.raises(ValueError, match="allows 256"):
        jacobi_block(model, [1] * 250, 8)
    with pytest.raises(ValueError, match="init must give"):
        jacobi_block(model, [1, 2], 4, init=[1, 2])
    with pytest.raises(NotImplementedError, match="greedy"):
        spec.generate(model, JacobiDraft(), [1, 2, 3], 5, temperature=1.0)
    with pytest.raises(ValueError, match="ngram"):
        LookaheadDraft(ngram=1)
