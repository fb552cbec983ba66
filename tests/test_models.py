import pytest
import torch

from book import models

# Parameter counts published with the weights (model cards, safetensors metadata).
PUBLISHED = {"Llama-2-7B": 6_738_415_616, "Llama-2-13B": 13_015_864_320, "Llama-2-70B": 68_976_648_192,
             "Llama-3-8B": 8_030_261_248, "Mistral-7B": 7_241_732_096, "GPT-2": 124_439_808}


@pytest.mark.parametrize("name,count", PUBLISHED.items())
def test_parameter_counts_match_published(name, count):
    assert models.architecture(name).n_params() == count


@pytest.mark.parametrize("name", models.architecture_names())
def test_transformers_model_of_that_shape_has_that_many_parameters(name):
    from transformers import AutoModelForCausalLM
    arch = models.architecture(name)
    with torch.device("meta"):                       # shapes only, no memory
        model = AutoModelForCausalLM.from_config(models.hf_config(arch))
    assert sum(p.numel() for p in model.parameters()) == arch.n_params()


def test_attention_kinds_and_kv_bytes():
    assert models.architecture("Llama-2-7B").attention == "MHA"
    l70 = models.architecture("Llama-2-70B")
    assert l70.attention == "GQA"
    assert l70.kv_bytes_per_token("fp16") == 2 * 80 * 8 * 128 * 2          # 327,680 bytes
    mqa = models.Architecture("tiny-mqa", "-", "llama", 2, 64, 4, 1, 16, 128, 100, 64)
    assert mqa.attention == "MQA"


def test_lookup_is_forgiving_but_unknown_names_list_known_ones():
    assert models.architecture("meta-llama/Llama-2-7b-hf").name == "Llama-2-7B"
    assert models.architecture("llama-3-8b").name == "Llama-3-8B"
    assert models.architecture("gpt2").name == "GPT-2"
    with pytest.raises(KeyError, match="known models: Llama-2-7B, Llama-2-13B"):
        models.architecture("Llama-5-1T")


def test_bad_architectures_are_rejected():
    with pytest.raises(ValueError, match="must be positive"):
        models.Architecture("bad", "-", "llama", 0, 64, 4, 4, 16, 128, 100, 64)
    with pytest.raises(ValueError, match="KV groups"):
        models.Architecture("bad", "-", "llama", 2, 64, 4, 3, 16, 128, 100, 64)
    with pytest.raises(ValueError, match="positive"):
        models.architecture("GPT-2").with_layers(0)
    with pytest.raises(ValueError, match="unknown precision"):
        models.dtype_bytes("fp12")


def test_build_random_has_the_right_shape_dtype_and_random_weights():
    model = models.build_random("GPT-2", n_layers=1, dtype="bf16", device="cpu")
    p = dict(model.named_parameters())
    assert p["transformer.wte.weight"].shape == (50257, 768)
    assert all(t.dtype == torch.bfloat16 for t in p.values())
    assert p["transformer.h.0.mlp.c_fc.weight"].float().std() > 0
    out = model(torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, 50257)


def test_fill_random_writes_distinct_small_values_quickly_drawn_once():
    a, b = torch.empty(3000, 4096), torch.empty(3000, 4096, dtype=torch.bfloat16)
    norm = torch.zeros(64)
    models.fill_random_([a, norm, b], seed=1)
    assert a.abs().max() <= 0.02 and (a != 0).float().mean() > 0.999 and a.std() > 0.01
    assert torch.equal(norm, torch.ones(64))                         # a norm weight starts at 1
    assert len({tuple(r[:8].tolist()) for r in a}) == a.shape[0]     # no two rows alike (the block length is prime)
    assert not torch.equal(a.to(torch.bfloat16), b)                  # each tensor starts elsewhere in the block
    c = torch.empty(3000, 4096)
    models.fill_random_([c], seed=1)
    assert torch.equal(a, c)                                         # seeded: the same values again


def test_build_random_llama_matches_a_fresh_model_but_its_weights():
    from transformers import AutoModelForCausalLM
    arch = models.architecture("Llama-2-7B").with_layers(1)
    small = models.Architecture("small", "-", "llama", 2, 64, 4, 2, 16, 128, 100, 64)
    m = models.build_random(small, dtype="fp32")
    fresh = AutoModelForCausalLM.from_config(models.hf_config(small))
    for (n, got), (_, want) in zip(m.named_buffers(), fresh.named_buffers()):   # rotary frequencies computed
        assert torch.equal(got, want), n
    assert all(p.device.type == "cpu" and p.abs().sum() > 0 for p in m.parameters())
    assert models.build_random(arch, dtype="bf16", device="meta").model.layers[0].mlp.up_proj.weight.is_meta


def test_build_random_llama_with_fewer_layers():
    model = models.build_random("Llama-3-8B", n_layers=1, dtype="bf16", device="meta")
    assert model.config.num_hidden_layers == 1 and model.config.num_key_value_heads == 8
    assert sum(p.numel() for p in model.parameters()) == models.architecture("Llama-3-8B").with_layers(1).n_params()


def _tiny_llama_folder(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    return tmp_path


def test_load_from_a_local_folder(tmp_path):
    model = models.load(_tiny_llama_folder(tmp_path), dtype="bf16", device="cpu")
    assert model.config.hidden_size == 32 and next(model.parameters()).dtype == torch.bfloat16
    assert not model.training


def test_load_explains_offline_and_bad_folders(tmp_path, monkeypatch):
    import book
    book.set_online(False)
    with pytest.raises(models.OfflineError, match="(?s)offline.*HF_HUB_OFFLINE=1.*online=True"):
        models.load("Llama-2-7B")
    with pytest.raises(models.OfflineError):
        models.load_tokenizer("someone/some-model")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        models.load(tmp_path)
    with pytest.raises(KeyError, match="known models"):
        models.load("not-a-model")
