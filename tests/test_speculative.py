"""book.speculative: windows, the loop detector and acceptance rates on tiny random models (appendix A)."""
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
    with pytest.raises(ValueError):
        speculative.windows(torch.arange(5), 10)
    with pytest.raises(ValueError):
        speculative.windows(torch.zeros(2, 5), 2)


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


def test_acceptance_sampled_is_overlap_of_distributions():
    t, d = torch.zeros(4, 4), torch.zeros(4, 4)
    t[:, 0], d[:, 1] = 50.0, 50.0          # both sure, and of different tokens
    a = speculative.acceptance_rates(_Toy(t), _Toy(d), torch.zeros(1, 3, dtype=torch.long), skip=1)
    assert a["greedy"] == 0.0 and a["positions"] == 2
    assert a["sampled"][1.0] < 1e-6
    with pytest.raises(ValueError):
        speculative.acceptance_rates(_Toy(t), _Toy(d), torch.zeros(1, 3, dtype=torch.long), temperatures=(0,))
