"""The book's own models as shipped in book/weights: checksums, size, offline loading, agreement (appendix A)."""
import json

import pytest
import torch

from book import models, train
from book.llama import Llama

MANIFEST = json.loads((models.WEIGHTS / "manifest.json").read_text())


def test_every_shipped_file_matches_its_checksum_and_nothing_is_unlisted():
    on_disk = {p.relative_to(models.WEIGHTS).as_posix() for p in models.WEIGHTS.rglob("*")
               if p.is_file() and p.name != "manifest.json"}
    assert on_disk == set(MANIFEST["files"])
    for rel, entry in MANIFEST["files"].items():
        path = models.WEIGHTS / rel
        assert path.stat().st_size == entry["bytes"], rel
        assert train.sha256(path) == entry["sha256"], f"{rel} differs from the manifest (and the model card)"


def test_the_weights_fit_the_budget_and_are_half_precision():
    from safetensors import safe_open
    total = sum(e["bytes"] for e in MANIFEST["files"].values())
    # 25 MB for the three autoregressive models, plus chapter 06's coder-sized diffusion model (appendix A says why)
    assert total <= 46e6, f"shipped models take {total / 1e6:.1f} MB, over the 46 MB budget"
    for name in (*models.SHIPPED, "coder-diffusion"):
        with safe_open(models.WEIGHTS / name / "model.safetensors", "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} <= {"BF16", "F16"}


@pytest.mark.parametrize("name", models.SHIPPED)
def test_a_shipped_model_loads_offline_by_its_short_name(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = models.load(name, dtype="fp32")
    tok = models.load_tokenizer(name)
    spec = train.SPECS[name]
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (spec.hidden, spec.layers)
    assert sum(p.numel() for p in model.parameters()) == MANIFEST["models"][name]["params"]
    assert tok.decode(tok("import os\n")["input_ids"]) == "import os\n"


def test_unknown_short_names_list_the_books_models():
    with pytest.raises(KeyError, match="coder-draft"):
        models.load("coder-large")
    with pytest.raises(KeyError, match="not one of the book's own models"):
        models.shipped_path("gpt-5")


@pytest.fixture(scope="module")
def pair():
    return models.load("coder", dtype="fp32"), models.load("coder-draft", dtype="fp32"), models.load_tokenizer("coder")


def _prompt(tok) -> torch.Tensor:
    corpus = train.load_corpus()
    text = sorted(corpus.val.items())[0][1][:400]
    return tok(text, return_tensors="pt")["input_ids"]


def test_assisted_generation_gives_the_targets_greedy_output(pair):
    target, draft, tok = pair
    x = _prompt(tok)
    alone = target.generate(x, max_new_tokens=40, do_sample=False, pad_token_id=tok.eos_token_id)
    assisted = target.generate(x, max_new_tokens=40, do_sample=False, assistant_model=draft,
                               pad_token_id=tok.eos_token_id)
    assert torch.equal(alone, assisted)


def test_the_books_decoder_runs_the_shipped_model_like_transformers(pair):
    target, _, tok = pair
    x = _prompt(tok)
    hf = target.generate(x, max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id)
    ours = Llama.from_hf(target).generate(x, 24)
    new = hf[:, x.shape[1]:]                         # transformers stops early at an end-of-text token
    assert new.shape[1] > 0 and torch.equal(ours[:, :new.shape[1]], new)


@pytest.mark.parametrize("name", models.SHIPPED)
def test_the_tokenizer_config_names_a_class_transformers_4_and_5_both_have(name):
    cfg = json.loads((models.WEIGHTS / name / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"      # 4.x has no TokenizersBackend (Colab)
    assert not {"is_local", "local_files_only"} & set(cfg)
