"""book.diffusion: the masking process, the weighted loss, the unmasking schedule and sampler, saving and loading, and
the training itself is tested in test_train.py (chapter 06)."""
import math

import pytest
import torch

from book import diffusion as D

CFG = D.DiffusionConfig(vocab=50, hidden=32, layers=2, heads=2, ffn=64, context=64)


def _model(seed=0):
    torch.manual_seed(seed)
    return D.MaskedDiffusionLM(CFG).eval()


def test_the_model_is_bidirectional_and_never_predicts_mask():
    m = _model()
    x = torch.randint(0, 50, (1, 10))
    logits = m(x)
    assert logits.shape == (1, 10, 50) and CFG.mask_id == 50          # [MASK] is an input, never an output
    y = x.clone()
    y[0, 9] = (x[0, 9] + 1) % 50                                       # change the last token ...
    assert not torch.allclose(m(y)[0, 0], logits[0, 0])               # ... and the first position's output moves
    with pytest.raises(ValueError, match="context"):
        m(torch.zeros(1, 65, dtype=torch.long))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="positive"):
        D.DiffusionConfig(vocab=0, hidden=32, layers=1, heads=2, ffn=8)
    with pytest.raises(ValueError, match="heads"):
        D.DiffusionConfig(vocab=10, hidden=30, layers=1, heads=4, ffn=8)


def test_masking_follows_t_per_row():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (3, 4000))
    noisy, masked = D.mask_tokens(x, torch.tensor([0.0, 0.3, 1.0]), CFG.mask_id, g)
    assert masked[0].sum() == 0 and masked[2].all()
    assert abs(masked[1].float().mean().item() - 0.3) < 0.03
    assert torch.equal(noisy[~masked], x[~masked]) and (noisy[masked] == CFG.mask_id).all()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        D.mask_tokens(x, torch.tensor([0.1, 0.2, 1.5]), CFG.mask_id)
    with pytest.raises(ValueError, match="one t per row"):
        D.mask_tokens(x, torch.tensor([0.1]), CFG.mask_id)


def test_the_loss_is_the_cross_entropy_of_masked_tokens_weighted_by_one_over_t():
    m = _model()
    x = torch.randint(0, 50, (4, 16))
    loss = D.diffusion_loss(m, x, torch.Generator().manual_seed(1))
    assert loss.item() > 0 and math.isfinite(loss.item())
    loss.backward()
    assert m.embed.weight.grad is not None and m.blocks[0].wqkv.weight.grad.abs().sum() > 0
    # an untrained model guesses about uniformly; the weighted bound then sits near log(vocab) per token
    bound = sum(D.diffusion_loss(m, x, torch.Generator().manual_seed(s)).item() for s in range(40)) / 40
    assert abs(bound - math.log(50)) < 0.35 * math.log(50)


def test_the_schedule_unmasks_everything_in_the_given_steps():
    assert D.unmask_schedule(8, 8) == [1] * 8
    assert D.unmask_schedule(8, 1) == [8]
    assert D.unmask_schedule(10, 4) == [2, 3, 2, 3] and sum(D.unmask_schedule(64, 7)) == 64
    with pytest.raises(ValueError, match="at least one"):
        D.unmask_schedule(4, 5)
    with pytest.raises(ValueError, match="n >= 1"):
        D.unmask_schedule(0, 1)


@pytest.mark.parametrize("order", ["confidence", "random"])
def test_sampling_keeps_the_prompt_and_unmasks_per_schedule(order):
    m = _model()
    prompt = torch.randint(0, 50, (2, 5))
    trace = []
    out = D.sample(m, prompt, 12, 4, order=order, generator=torch.Generator().manual_seed(0), trace=trace)
    assert out.shape == (2, 17) and torch.equal(out[:, :5], prompt) and (out != CFG.mask_id).all()
    counts = [int((t[:, 5:] != CFG.mask_id).sum(1)[0]) for t in trace]
    assert counts == [3, 6, 9, 12]                                     # the linear schedule, per row
    for before, after in zip(trace, trace[1:]):                        # an unmasked token never changes again
        kept = before != CFG.mask_id
        assert torch.equal(after[kept], before[kept])


def test_one_token_per_step_by_confidence_is_deterministic_and_sampling_varies():
    m = _model()
    prompt = torch.randint(0, 50, (1, 4))
    a, b = D.sample(m, prompt, 6, 6), D.sample(m, prompt, 6, 6)
    assert torch.equal(a, b)
    hot = {tuple(D.sample(m, prompt, 6, 2, temperature=5.0, generator=torch.Generator().manual_seed(s))[0].tolist())
           for s in range(4)}
    assert len(hot) > 1
    with pytest.raises(ValueError, match="order"):
        D.sample(m, prompt, 6, 2, order="left")
    with pytest.raises(ValueError, match="context"):
        D.sample(m, prompt, 61, 2)


def test_save_and_load_round_trip(tmp_path):
    m = _model()
    D.save(m, tmp_path / "m", dtype=torch.float32)
    back = D.load(tmp_path / "m")
    x = torch.randint(0, 50, (1, 8))
    torch.testing.assert_close(back(x), m(x))
    with pytest.raises(FileNotFoundError, match="book.train coder-diffusion"):
        D.load(tmp_path / "nothing")


def test_pass_work_counts_a_bidirectional_pass_by_hand():
    c = D.DiffusionConfig(vocab=10, hidden=4, layers=2, heads=2, ffn=6, context=8)
    w = D.pass_work(c, tokens=3, batch=2, dtype="fp32")
    matmul = 2 * (4 * 16 + 3 * 4 * 6) + 10 * 4                  # blocks + tied LM head = 312 weights
    assert w.flops == 2 * (2 * matmul * 3 + 4 * 2 * 4 * 9)       # every (query, key) pair, both ways
    assert w.bytes == matmul * 4 + 2 * 3 * (4 + 10) * 4
    assert D.pass_work(c, 3, 2, "bf16").bytes == matmul * 2 + 2 * 3 * 14 * 2
    with pytest.raises(ValueError, match="context 8"):
        D.pass_work(c, 9)
    with pytest.raises(ValueError, match=">= 1"):
        D.pass_work(c, 0)
