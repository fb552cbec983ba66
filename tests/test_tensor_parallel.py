"""book.tensor_parallel: a decode step split over N GPUs, checked against hand calculations (chapter 06)."""
import pytest

from book import tensor_parallel as TP
from book.hardware import GB
from book.memory import GIB


def test_llama_2_7b_on_two_a100s_by_hand():
    s = TP.tp_decode("Llama-2-7B", 2, "A100 80GB", "NVLink 3 (A100 SXM)", context=512, latency_us=10)
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096          # q, k, v, o; gate, up, down; two norms
    layers = 32 * per_layer * 2                                         # bf16
    emb = 32000 * 4096 * 2
    assert s.weight_bytes_held == layers / 2 + 2 * emb                  # embedding and LM head copied (gpt-fast)
    assert s.weight_bytes_read == layers / 2 + emb                      # the LM head read, the embedding not
    assert s.kv_bytes == 2 * 32 * 16 * 128 * 2 * 512                    # 16 of 32 KV heads on each GPU
    assert s.allreduces == 64 and s.allreduce_bytes == 4096 * 2
    assert s.comm_s == pytest.approx(64 * (10e-6 + 8192 / 300e9))      # 2 (N-1)/N = 1 on two GPUs
    assert s.memory_s == pytest.approx((layers / 2 + emb + s.kv_bytes) / (2039 * GB))
    assert s.tokens_per_s == pytest.approx(1 / (s.memory_s + s.comm_s)) and s.fits


def test_one_gpu_has_no_communication_and_sharding_the_vocabulary_splits_the_head():
    one = TP.tp_decode("Llama-2-7B", 1)
    assert one.allreduces == 0 and one.comm_s == 0
    rep, shard = TP.tp_decode("Llama-2-7B", 4), TP.tp_decode("Llama-2-7B", 4, shard_vocab=True)
    emb = 32000 * 4096 * 2
    assert rep.weight_bytes_held - shard.weight_bytes_held == pytest.approx(2 * emb * 3 / 4)
    assert rep.weight_bytes_read - shard.weight_bytes_read == pytest.approx(emb * 3 / 4)


def test_more_gpus_than_kv_heads_copy_one_head_each_and_70b_needs_two_a100s():
    a = TP.tp_decode("Llama-2-70B", 16, context=1024)
    assert a.kv_bytes == 2 * 80 * 1 * 128 * 2 * 1024
    assert not TP.tp_decode("Llama-2-70B", 1).fits                      # 138 GB of weights on an 80 GiB card
    two = TP.tp_decode("Llama-2-70B", 2)
    assert two.fits and two.held_gb * GB <= 80 * GIB


def test_the_step_stops_scaling_when_latency_dominates():
    steps = [TP.tp_decode("Llama-2-7B", g, latency_us=20) for g in (1, 2, 4, 8)]
    speedups = [steps[0].step_s / s.step_s for s in steps]
    assert speedups[1] > 1 and all(b > a for a, b in zip(speedups, speedups[1:]))
    assert speedups[-1] < 8 * 0.6                                      # far from 8x at batch 1
    no_latency = TP.tp_decode("Llama-2-7B", 8, latency_us=0)
    assert no_latency.comm_s == pytest.approx(64 * 2 * 7 / 8 * 8192 / 300e9)


def test_allreduce_time():
    link = TP.interconnect("PCIe 4.0 x16")
    assert TP.allreduce_seconds(1e6, 1, link, 1e-5) == 0.0
    assert TP.allreduce_seconds(1e6, 4, link, 1e-5) == pytest.approx(1e-5 + 1.5e6 / 32e9)
    with pytest.raises(ValueError):
        TP.allreduce_seconds(-1, 2, link, 0)


def test_bad_requests_are_refused_with_what_was_wrong():
    with pytest.raises(ValueError, match="split evenly over 3 GPUs"):
        TP.tp_decode("Llama-2-7B", 3)
    with pytest.raises(ValueError, match="positive integer"):
        TP.tp_decode("Llama-2-7B", 0)
    with pytest.raises(ValueError, match="at most 4096 tokens"):
        TP.tp_decode("Llama-2-7B", 2, context=5000)
    with pytest.raises(KeyError, match="unknown GPU"):
        TP.tp_decode("Llama-2-7B", 2, "B9000")
    with pytest.raises(KeyError, match="unknown interconnect"):
        TP.tp_decode("Llama-2-7B", 2, link="carrier pigeon")
    with pytest.raises(KeyError, match="unknown model"):
        TP.tp_decode("Llama-9", 2)
    with pytest.raises(ValueError, match="batch and context"):
        TP.tp_decode("Llama-2-7B", 2, batch=0)


def test_gpt_fast_bandwidth_column_is_the_bytes_each_gpu_holds():
    """gpt-fast copies the embedding and LM head on every GPU: its GB/s / tokens/s is the book's held bytes."""
    from book import published
    for model in ("Llama-2-7B", "Llama-2-70B"):
        v = published.get(f"gpt-fast/tensor-parallel/{model}").values
        for g in (1, 2, 4, 8):
            if f"tokens_per_s_{g}gpu" not in v:
                continue
            per_gpu = v[f"achieved_bw_gbs_{g}gpu"] * GB / v[f"tokens_per_s_{g}gpu"]
            held = TP.tp_decode(model, g).weight_bytes_held
            assert abs(per_gpu / held - 1) < 0.03, (model, g, per_gpu / held)
