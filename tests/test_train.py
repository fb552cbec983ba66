"""book.train: the corpus, the tokenizer, and a few real training steps on the CPU (appendix A)."""
import dataclasses
import json
import math
import sysconfig
from pathlib import Path

import pytest
import torch

from book import train as T
from book.hardware import bf16_is_fast

TINY = T.ModelSpec("tiny", hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, context=64)
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def corpus():
    return T.load_corpus()


@pytest.fixture(scope="module")
def tokenizer(corpus):
    texts = [corpus.train[k] for k in ("json/encoder.py", "json/decoder.py", "textwrap.py")]
    return T.train_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def streams(tokenizer):
    text = [(STDLIB / f).read_text() for f in ("json/encoder.py", "json/decoder.py", "textwrap.py")]
    return T.encode(tokenizer, text[:2]), T.encode(tokenizer, text[2:])


def test_test_code_is_recognised():
    assert T.is_test_path(Path("test/test_os.py"))
    assert T.is_test_path(Path("idlelib/idle_test/htest.py"))
    assert T.is_test_path(Path("unittest/test/support.py"))
    assert T.is_test_path(Path("test_foo.py"))
    assert not T.is_test_path(Path("unittest/case.py"))
    assert not T.is_test_path(Path("doctest.py"))


def test_the_split_is_by_file_deterministic_and_excludes_tests(corpus):
    assert corpus.python_version.count(".") == 2
    assert set(corpus.train).isdisjoint(corpus.val)
    assert not any(T.is_test_path(Path(p)) for p in [*corpus.train, *corpus.val])
    assert "json/encoder.py" in corpus.train or "json/encoder.py" in corpus.val
    assert all(T.split_of(p) == "val" for p in corpus.val) and all(T.split_of(p) == "train" for p in corpus.train)
    share = len(corpus.val) / (len(corpus.val) + len(corpus.train))
    assert 0.02 < share < 0.10
    s = corpus.summary()
    assert s["train_bytes"] == sum(len(t.encode()) for t in corpus.train.values()) and s["val_files"] == len(corpus.val)


def test_bad_corpus_arguments_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no standard library"):
        T.load_corpus(tmp_path / "missing")
    with pytest.raises(ValueError, match="val_percent"):
        T.split_of("a.py", 0)
    (tmp_path / "only.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="need both"):
        T.load_corpus(tmp_path)


def test_tokenizer_round_trips_and_counts_bytes(tokenizer, tmp_path):
    from transformers import AutoTokenizer
    text = "def f(x):\n    return {'é': x ** 2}  # naïve ✓\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode())                       # the merges compress
    lengths = T.token_byte_lengths(tokenizer)
    assert int(lengths[ids].sum()) == len(text.encode())
    assert lengths[tokenizer.eos_token_id] == 0
    tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text, add_special_tokens=False)["input_ids"] == ids and again.eos_token == T.EOS
    stream = T.encode(tokenizer, ["a = 1", "b = 2"])
    assert (stream == tokenizer.eos_token_id).sum() == 2 and stream[-1] == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="vocab_size"):
        T.train_tokenizer(["x"], vocab_size=100)


def test_learning_rate_warms_up_then_decays():
    cfg = T.TrainConfig(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [T.lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_a_few_training_steps_lower_the_validation_loss(tokenizer, streams):
    train_tokens, val_tokens = streams
    cfg = T.TrainConfig(steps=60, batch=8, seq=32, lr=1e-2, warmup=5, eval_every=30, eval_windows=16)
    model, log = T.train(TINY, cfg, tokenizer, train_tokens, val_tokens, progress=False)
    uniform = math.log(len(tokenizer))              # an untrained model predicts about uniformly
    first, last = log["train"][0][1], log["train"][-1][1]
    assert log["step"] == 60 and log["tokens_seen"] == 60 * 8 * 32
    assert log["precision"] == ("bf16 autocast" if bf16_is_fast("cpu") else "fp32")   # recorded in the manifest
    assert last < first - 0.4, f"training loss went {first:.2f} -> {last:.2f}"
    assert log["val"][-1][1] < log["val"][0][1] < uniform - 0.5
    ev = T.evaluate(model, val_tokens, T.token_byte_lengths(tokenizer), 32, 16)
    assert 0 < ev["bits_per_byte"] < 8 and ev["bytes"] > ev["tokens"]


def test_a_few_diffusion_training_steps_lower_the_bound(tokenizer, streams, tmp_path):
    from book import diffusion as D
    train_tokens, val_tokens = streams
    spec = dataclasses.replace(TINY, name="tiny-diffusion", kv_heads=2, kind="diffusion")
    cfg = T.TrainConfig(steps=60, batch=8, seq=32, lr=1e-2, warmup=5, eval_every=30, eval_windows=8)
    model, log = T.train(spec, cfg, tokenizer, train_tokens, val_tokens, tmp_path, progress=False)
    assert isinstance(model, D.MaskedDiffusionLM) and log["objective"].startswith("masked diffusion")
    first, last = log["train"][0][1], log["train"][-1][1]
    assert last < first - 0.4, f"training loss went {first:.2f} -> {last:.2f}"
    assert log["val"][-1][1] < math.log(len(tokenizer))     # below an untrained (uniform) guess
    ev = T._evaluate(model, spec, val_tokens, T.token_byte_lengths(tokenizer), 32, 8)
    assert 0 < ev["bits_per_byte"] < 8 and "bound" in ev
    resumed, log2 = T.train(spec, cfg, tokenizer, train_tokens, val_tokens, tmp_path, progress=False)
    assert log2["step"] == 60 and torch.equal(resumed.embed.weight, model.embed.weight)   # from its checkpoint
    with pytest.raises(ValueError, match="grouped-query"):
        T.diffusion_config(TINY, tokenizer)


def test_training_resumes_exactly_where_it_stopped(tokenizer, streams, tmp_path):
    train_tokens, val_tokens = streams
    cfg = T.TrainConfig(steps=12, batch=4, seq=16, warmup=2, eval_every=6, eval_windows=4, ckpt_every=100)
    straight, _ = T.train(TINY, cfg, tokenizer, train_tokens, val_tokens, tmp_path / "a", progress=False)
    _, log = T.train(TINY, cfg, tokenizer, train_tokens, val_tokens, tmp_path / "b", progress=False, stop_after=5)
    assert log["step"] == 5 and (tmp_path / "b" / "last.pt").exists()
    resumed, log = T.train(TINY, cfg, tokenizer, train_tokens, val_tokens, tmp_path / "b", progress=False)
    assert log["step"] == 12
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    other = dataclasses.replace(cfg, lr=0.5)
    with pytest.raises(ValueError, match="another spec or config"):
        T.train(TINY, other, tokenizer, train_tokens, val_tokens, tmp_path / "b", progress=False)


def test_bad_training_input_is_refused(tokenizer, streams):
    train_tokens, val_tokens = streams
    with pytest.raises(ValueError, match="longer than"):
        T.train(TINY, T.TrainConfig(seq=128), tokenizer, train_tokens, val_tokens, progress=False)
    with pytest.raises(ValueError, match="training tokens"):
        T.train(TINY, T.TrainConfig(seq=32), tokenizer, train_tokens[:20], val_tokens, progress=False)
    with pytest.raises(ValueError, match="steps"):
        T.train(TINY, T.TrainConfig(steps=0, seq=32), tokenizer, train_tokens, val_tokens, progress=False)


def test_an_exported_model_loads_in_transformers_and_in_the_books_decoder(tokenizer, streams, tmp_path):
    from book import models
    from book.llama import Llama
    cfg = T.TrainConfig(steps=3, batch=2, seq=16, warmup=1, eval_every=3, eval_windows=2)
    model, _ = T.train(TINY, cfg, tokenizer, *streams, progress=False)
    T.export(model, tokenizer, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists()
    hf = models.load(tmp_path / "m", dtype="fp32")
    ours = Llama.from_hf(tmp_path / "m", dtype="fp32")
    x = streams[1][:16][None]
    torch.testing.assert_close(ours(x), hf(input_ids=x).logits, atol=1e-4, rtol=1e-4)
    assert models.load_tokenizer(tmp_path / "m").eos_token == T.EOS


def test_the_draft_costs_at_most_a_tenth_of_the_target():
    vocab = 4096
    assert T.SPECS["coder-draft"].flops_per_token(vocab) <= 0.1 * T.SPECS["coder"].flops_per_token(vocab)


def test_distill_loss_is_the_kl_divergence_and_zero_only_for_the_same_distribution():
    torch.manual_seed(0)
    p, q = torch.randn(3, 5, 11), torch.randn(3, 5, 11)
    assert float(T.distill_loss(p, p)) == pytest.approx(0.0, abs=1e-6)
    assert float(T.distill_loss(p + 3.0, p)) == pytest.approx(0.0, abs=1e-6)     # logits up to a constant
    lp, lq = torch.log_softmax(p, -1), torch.log_softmax(q, -1)
    want = (lp.exp() * (lp - lq)).sum(-1).mean()                                    # KL(teacher p || student q)
    assert float(T.distill_loss(q, p)) == pytest.approx(float(want), rel=1e-5)
    with pytest.raises(ValueError, match="differ in shape"):
        T.distill_loss(p, q[..., :7])


def test_distillation_pulls_the_student_towards_the_teacher(tokenizer, streams):
    from book import speculative
    train_tokens, val_tokens = streams
    cfg = T.TrainConfig(steps=40, batch=8, seq=32, lr=1e-2, warmup=5, eval_every=40, eval_windows=8)
    teacher, _ = T.train(dataclasses.replace(TINY, layers=2, hidden=48), cfg, tokenizer, train_tokens, val_tokens,
                         progress=False)
    student, _ = T.train(TINY, dataclasses.replace(cfg, steps=10), tokenizer, train_tokens, val_tokens,
                         progress=False)
    kd_cfg = dataclasses.replace(cfg, steps=40, lr=3e-3)
    distilled, log = T.train(TINY, kd_cfg, tokenizer, train_tokens, val_tokens, progress=False,
                             init=student.state_dict(), teacher=teacher)
    assert log["objective"].startswith("distillation") and log["train"][-1][1] < log["train"][0][1]
    held = speculative.windows(val_tokens, 32, max_windows=8)
    before = speculative.acceptance_rates(teacher, student, held)
    after = speculative.acceptance_rates(teacher, distilled, held)
    assert after["sampled"][1.0] > before["sampled"][1.0]


def test_the_manifest_keeps_models_not_retrained(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "w.bin").write_bytes(name.encode())
    log = {"train": [[1, 2.0]], "val": [[1, 2.0, 1.0]], "params": 1}
    T.write_manifest(tmp_path, {"source": "x"}, {"a": log, "b": log}, {})
    (tmp_path / "b" / "w.bin").write_bytes(b"bb")
    m = json.loads(T.write_manifest(tmp_path, {"source": "x"}, {"b": {**log, "params": 2}}, {}).read_text())
    assert set(m["models"]) == {"a", "b"} and m["models"]["b"]["params"] == 2
    assert m["files"]["b/w.bin"]["sha256"] == T.sha256(tmp_path / "b" / "w.bin")
