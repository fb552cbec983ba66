"""The book's decoder against transformers.LlamaForCausalLM: logits, greedy tokens, ragged batches, rewind, errors."""
import pytest
import torch

from book.llama import KVCache, Llama, architecture_from_hf, pad_prompts

transformers = pytest.importorskip("transformers")

SHAPES = {  # (query heads, KV heads, head_dim or None): MHA, GQA, MQA, and a head_dim that is not hidden / heads
    "MHA": (4, 4, None), "GQA": (4, 2, None), "MQA": (4, 1, None), "GQA-hd32": (8, 2, 32)}
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}   # max |book - HF| relative to max |HF logit|


def hf_model(shape: str = "GQA", dtype=torch.float32, seed: int = 0, **overrides):
    heads, kv, hd = SHAPES[shape]
    cfg = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=heads,
               num_key_value_heads=kv, max_position_embeddings=256, rope_theta=10000.0, bos_token_id=1,
               eos_token_id=2, pad_token_id=None)
    if hd:
        cfg["head_dim"] = hd
    cfg.update(overrides)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).to(dtype).eval()


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 96, (b, t), generator=torch.Generator().manual_seed(seed))


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf(shape, dtype):
    hf = hf_model(shape, dtype)
    book = Llama.from_hf(hf)
    x = tokens(2, 12)
    with torch.no_grad():
        ref = hf(x).logits
    assert book.dtype == dtype
    assert rel_err(book(x), ref) < TOL[dtype]                      # one parallel pass, no cache
    book.setup_cache(batch=2, max_len=32)
    assert rel_err(book.prefill(x[:, :8]), ref[:, 7]) < TOL[dtype]  # cached: prefill, then one token at a time
    for t in range(8, 12):
        assert rel_err(book.decode_step(x[:, t]), ref[:, t]) < TOL[dtype]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_tokens_match_hf_generate(shape):
    hf = hf_model(shape)
    book = Llama.from_hf(hf)
    x = tokens(2, 7, seed=3)
    with torch.no_grad():
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, min_new_tokens=12,
                          do_sample=False, pad_token_id=0)[:, 7:]
    # min_new_tokens only masks the end-of-sequence token, which the book does not pick here either
    assert torch.equal(book.generate(x, 12), ref)


def test_tied_embeddings_and_rope_scaling():
    hf = hf_model("GQA", tie_word_embeddings=True,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64})
    book = Llama.from_hf(hf)
    assert book.lm_head is book.embed
    x = tokens(1, 100)
    with torch.no_grad():
        assert rel_err(book(x), hf(x).logits) < TOL[torch.float32]


def test_load_from_saved_folder(tmp_path):
    hf = hf_model("GQA")
    hf.save_pretrained(tmp_path)
    book = Llama.from_hf(tmp_path, dtype="fp32", device="cpu")
    x = tokens(1, 9)
    with torch.no_grad():
        assert rel_err(book(x), hf(x).logits) < TOL[torch.float32]
    assert architecture_from_hf(hf.config).n_kv_heads == 2


def test_ragged_batch_equals_each_sequence_alone():
    book = Llama.from_hf(hf_model("GQA"))
    prompts = [tokens(1, n, seed=n)[0].tolist() for n in (3, 9, 5)]
    book.setup_cache(batch=4, max_len=32)                 # allocated for 4, used for 3
    batched = book.generate(prompts, 6)
    for i, p in enumerate(prompts):
        alone = book.generate(torch.tensor([p]), 6)
        assert torch.equal(batched[i], alone[0]), f"sequence {i} differs when batched"
    # the logits too, not only the argmax
    tok, lengths = pad_prompts(prompts, device=book.device)
    book.setup_cache(batch=3, max_len=32)
    lb = book.prefill(tok, lengths)
    nxt = lb.argmax(-1)
    db = book.decode_step(nxt)
    for i, p in enumerate(prompts):
        book.setup_cache(batch=1, max_len=32)
        la = book.prefill(torch.tensor([p]))
        assert rel_err(lb[i], la[0]) < TOL[torch.float32]
        assert rel_err(db[i], book.decode_step(nxt[i:i + 1])[0]) < TOL[torch.float32]


def test_rewind_and_explicit_positions_redo_the_same_step():
    book = Llama.from_hf(hf_model("MQA"))
    book.setup_cache(batch=2, max_len=24)
    x = tokens(2, 10, seed=5)
    book.prefill(x[:, :4])
    first = [book.decode_step(x[:, t]) for t in range(4, 10)]
    book.rewind(6)                                         # keep 6 positions: redo the steps from position 6
    assert book.cache.lengths.tolist() == [6, 6]
    for t in range(6, 10):
        assert torch.equal(book.decode_step(x[:, t]), first[t - 4])
    again = book.decode_step(x[:, 7], positions=[7, 7])     # explicit positions rewind implicitly
    assert torch.equal(again, first[3]) and book.cache.lengths.tolist() == [8, 8]
    book.rewind([5, 8])                                    # per-sequence lengths
    assert book.cache.lengths.tolist() == [5, 8]


def test_extend_gives_the_logits_of_single_steps():
    book = Llama.from_hf(hf_model("GQA"))
    book.setup_cache(batch=1, max_len=32)
    x = tokens(1, 12, seed=7)
    book.prefill(x[:, :6])
    many = book.extend(x[:, 6:11])                          # e.g. verifying 5 draft tokens at once
    book.rewind(6)
    for j, t in enumerate(range(6, 11)):
        assert rel_err(many[:, j], book.decode_step(x[:, t])) < TOL[torch.float32]


def test_bytes_per_step():
    hf = hf_model("GQA")
    book = Llama.from_hf(hf)
    n_all = sum(p.numel() for p in hf.parameters())
    a = book.arch
    assert book.weight_bytes_per_step(1) == 4 * (n_all - a.vocab * a.hidden + a.hidden)
    assert book.kv_bytes_per_step(2, 10) == 2 * a.n_layers * 2 * a.n_kv_heads * 10 * a.head_dim * 4


def test_bad_input_errors():
    book = Llama.from_hf(hf_model("GQA"))
    with pytest.raises(RuntimeError, match="setup_cache"):
        book.prefill(tokens(1, 4))
    book.setup_cache(batch=2, max_len=16)
    with pytest.raises(ValueError, match="prompt of 20 tokens does not fit the KV cache of 16"):
        book.prefill(tokens(1, 20))
    with pytest.raises(ValueError, match="batch of 3 sequences, but the KV cache was allocated for 2"):
        book.prefill(tokens(3, 4))
    with pytest.raises(TypeError, match="integer token ids"):
        book.prefill(tokens(1, 4).float())
    with pytest.raises(ValueError, match="are on meta but the model is on cpu"):
        book.prefill(torch.zeros(1, 4, dtype=torch.long, device="meta"))
    book.prefill(tokens(2, 15))
    book.decode_step(torch.tensor([5, 6]))                  # fills position 15, the last one
    with pytest.raises(ValueError, match="KV cache holds 16 positions"):
        book.decode_step(torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="batch of 3 sequences, but the KV cache was allocated for 2"):
        book.decode_step(torch.tensor([5, 6, 7]))
    with pytest.raises(ValueError, match="can only rewind"):
        book.rewind(17)
    book.cache = KVCache(2, 2, 2, 16, 16, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(TypeError, match="KV cache holds torch.bfloat16 but the model's weights are torch.float32"):
        book.prefill(tokens(1, 4))
    book.cache = KVCache(2, 2, 2, 16, 16, dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match="KV cache is on meta but the model is on cpu"):
        book.prefill(tokens(1, 4))
    with pytest.raises(ValueError, match="Llama family"):
        architecture_from_hf(transformers.GPT2Config())


def compiled_matches_eager(device: str, dtype) -> None:
    """The compiled step (CUDA graphs on a GPU) against the eager one, teacher-forced: both get the eager step's
    greedy token, so one rounding difference between fused and unfused kernels (on a random model whose logits are
    nearly tied) cannot change every later step; 40 steps cross the 32-position buckets of the padded cache."""
    hf = hf_model("GQA", dtype).to(device)
    eager, fast = Llama.from_hf(hf), Llama.from_hf(hf)
    x = tokens(2, 6).to(device)
    for m in (eager, fast):
        m.setup_cache(batch=2, max_len=64)
    fast.compile_decode(bucket=32)
    with torch.no_grad():
        a, b = eager.prefill(x), fast.prefill(x)
        for _ in range(40):
            nxt = a.argmax(-1)
            a, b = eager.decode_step(nxt), fast.decode_step(nxt)
            assert rel_err(b, a) < TOL[dtype]
    assert fast._compiled is not None                      # it ran compiled, not the eager fallback


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled / CUDA-graph decode step needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_decode_on_cuda_matches_eager(dtype, monkeypatch):
    monkeypatch.setenv("BOOK_STRICT_COMPILE", "1")         # a failing compile raises here instead of falling back
    compiled_matches_eager("cuda", dtype)


@pytest.mark.parametrize("rows_path", ["linear", "wx"])
def test_logits_match_hf_whichever_few_rows_path_is_chosen(rows_path, monkeypatch):
    from book import kernels
    monkeypatch.setattr(kernels, "_ROWS_CHOICE", {("cpu", torch.float32): rows_path})
    shape = list(SHAPES)[0]
    hf = hf_model(shape, torch.float32)
    book = Llama.from_hf(hf)
    x = tokens(3, 12)                                   # 3 x 1 rows a step, 3 x 8 in the prefill
    with torch.no_grad():
        ref = hf(x).logits
    book.setup_cache(batch=3, max_len=32)
    assert rel_err(book.prefill(x[:, :8]), ref[:, 7]) < TOL[torch.float32]
    for t in range(8, 12):
        assert rel_err(book.decode_step(x[:, t]), ref[:, t]) < TOL[torch.float32]
