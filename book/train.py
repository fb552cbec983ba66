"""Train the book's own small code models on the Python standard library (appendix A: the book's models).

    python -m book.train all              # tokenizer, draft, target, distilled draft, export, loss figure (resumable)
    python -m book.train coder-draft-distilled     # only the distilled draft, from the shipped draft and target
    python -m book.train coder-diffusion  # chapter 06: the masked-diffusion model (coder's shape and budget)
    python -m book.train target --steps 50 --out /tmp/run   # a short run somewhere else

Everything is read from the running interpreter's standard library, so no download is needed. Checkpoints go
to `checkpoints/<model>/last.pt` and a rerun resumes from them; `--fresh` starts over.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .device import device_name
from .hardware import bf16_is_fast

__all__ = ["Corpus", "ModelSpec", "TrainConfig", "SPECS", "CONFIGS", "DISTILLED", "WEIGHTS", "distill_loss",
           "load_corpus", "is_test_path", "split_of", "train_tokenizer", "encode", "token_byte_lengths",
           "llama_config", "diffusion_config", "lr_at", "evaluate", "train", "portable_tokenizer_config", "export", "write_manifest",
           "plot_loss", "sha256"]

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = Path(__file__).resolve().parent / "weights"      # shipped inside the package
CHECKPOINTS = ROOT / "checkpoints"                          # ignored by git
FIGURE = ROOT / "figures" / "training_loss.png"
EVAL_WINDOWS = 48   # validation windows scored during training (the model card scores all of them)
EOS = "<|endoftext|>"
_TEST_DIRS = {"test", "tests", "idle_test"}


# --- the corpus -------------------------------------------------------------------------------------------------

def is_test_path(relative: Path) -> bool:
    """True for test code: a folder named test/tests/idle_test anywhere in the path, or a test_*.py file."""
    return any(p in _TEST_DIRS for p in relative.parts[:-1]) or relative.name.startswith("test_")


def split_of(relative: str, val_percent: int = 5) -> str:
    """'val' or 'train' for a file, decided by a hash of its path: the same on every machine and run."""
    if not 0 < val_percent < 100:
        raise ValueError(f"val_percent must be between 1 and 99, got {val_percent}")
    bucket = int(hashlib.sha256(relative.encode()).hexdigest()[:8], 16) % 100
    return "val" if bucket < val_percent else "train"


@dataclass
class Corpus:
    """The standard library's Python source without its tests, split by file (appendix A)."""
    root: str
    python_version: str
    train: dict[str, str]          # relative path -> source text
    val: dict[str, str]

    def n_bytes(self, split: str) -> int:
        return sum(len(t.encode()) for t in getattr(self, split).values())

    def summary(self) -> dict:
        return {"source": "Python standard library (*.py, tests excluded)", "python_version": self.python_version,
                "train_files": len(self.train), "val_files": len(self.val),
                "train_bytes": self.n_bytes("train"), "val_bytes": self.n_bytes("val"),
                "split": "sha256(relative path) % 100 < 5 -> validation"}


def load_corpus(root: str | Path | None = None, val_percent: int = 5) -> Corpus:
    """Read every non-test *.py file of the standard library (of this interpreter unless `root` is given)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"no standard library folder at {root}")
    train: dict[str, str] = {}
    val: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "site-packages" in rel.parts or "dist-packages" in rel.parts or is_test_path(rel):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        (val if split_of(rel.as_posix(), val_percent) == "val" else train)[rel.as_posix()] = text
    if not train or not val:
        raise ValueError(f"{root} gave {len(train)} training and {len(val)} validation files; need both")
    return Corpus(str(root), platform.python_version(), train, val)


# --- the tokenizer ----------------------------------------------------------------------------------------------

def train_tokenizer(texts: list[str], vocab_size: int = 4096):
    """A byte-level BPE (every byte string is encodable) trained on `texts`, as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    if vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must exceed the 256 byte tokens plus {EOS}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS,
                                   unk_token=None, clean_up_tokenization_spaces=False)


def encode(tokenizer, texts: list[str]) -> torch.Tensor:
    """One stream of token ids: every text followed by the end-of-text token."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def token_byte_lengths(tokenizer) -> torch.Tensor:
    """How many UTF-8 bytes of text each token id stands for (0 for the end-of-text token): for bits per byte."""
    from tokenizers import pre_tokenizers
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())   # byte-level BPE writes each byte as one of 256 chars
    lengths = torch.zeros(len(tokenizer), dtype=torch.long)
    for token, idx in tokenizer.get_vocab().items():
        if token in tokenizer.all_special_tokens:
            continue
        if not set(token) <= alphabet:
            raise ValueError(f"token {token!r} is not byte-level BPE")
        lengths[idx] = len(token)
    return lengths


# --- the models -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    """The shape of one of the book's models (Llama architecture, tied input/output embeddings)."""
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int = 512
    kind: str = "causal"            # "causal": a Llama (transformers); "diffusion": book.diffusion's masked model

    def flops_per_token(self, vocab: int) -> int:
        """Multiply-adds x 2 of one decode step at short context: every matrix weight once, the LM head included (the
        norms' few weights left out)."""
        attn = self.hidden * self.hidden * 2 + 2 * self.hidden * (self.hidden // self.heads) * self.kv_heads
        return 2 * (self.layers * (attn + 3 * self.hidden * self.ffn) + vocab * self.hidden)


SPECS = {
    "coder": ModelSpec("coder", hidden=320, layers=7, heads=5, kv_heads=5, ffn=864),
    "coder-draft": ModelSpec("coder-draft", hidden=128, layers=2, heads=2, kv_heads=2, ffn=384),
}
SPECS["coder-draft-distilled"] = dataclasses.replace(SPECS["coder-draft"], name="coder-draft-distilled")
# Chapter 06's masked-diffusion model: coder's shape and training budget, bidirectional, trained to unmask.
SPECS["coder-diffusion"] = dataclasses.replace(SPECS["coder"], name="coder-diffusion", kind="diffusion")
# A distilled model: (the model its weights start from, the teacher whose next-token distributions it learns).
DISTILLED = {"coder-draft-distilled": ("coder-draft", "coder")}


@dataclass
class TrainConfig:
    """How one model is trained: AdamW, linear warm-up then cosine decay, bf16 autocast where bf16 is fast."""
    steps: int = 1600
    batch: int = 16
    seq: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_windows: int = EVAL_WINDOWS
    ckpt_every: int = 50
    seed: int = 0


CONFIGS = {"coder": TrainConfig(steps=1200, lr=2e-3), "coder-draft": TrainConfig(lr=3e-3),
           "coder-draft-distilled": TrainConfig(steps=600, lr=1e-3, warmup=20, eval_every=100),
           "coder-diffusion": TrainConfig(steps=1200, lr=2e-3)}


def llama_config(spec: ModelSpec, tokenizer):
    """The transformers LlamaConfig for a spec."""
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=spec.hidden, intermediate_size=spec.ffn,
                       num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                       num_key_value_heads=spec.kv_heads, max_position_embeddings=spec.context,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)


def diffusion_config(spec: ModelSpec, tokenizer):
    """The book.diffusion config for a spec (chapter 06)."""
    from .diffusion import DiffusionConfig
    if spec.kv_heads != spec.heads:
        raise ValueError(f"{spec.name}: the masked-diffusion model has no grouped-query attention")
    return DiffusionConfig(vocab=len(tokenizer), hidden=spec.hidden, layers=spec.layers, heads=spec.heads,
                           ffn=spec.ffn, context=spec.context)


def _evaluate(model, spec: ModelSpec, tokens: torch.Tensor, byte_lengths: torch.Tensor, seq: int,
              max_windows: int | None = None) -> dict:
    """`evaluate` for a causal model; for a diffusion model its validation bound (`book.diffusion.negative_elbo`),
    in the same units (nats per token, bits per byte), marked as a bound."""
    if spec.kind != "diffusion":
        return evaluate(model, tokens, byte_lengths, seq, max_windows)
    from .diffusion import negative_elbo
    n = (len(tokens) - 1) // seq if max_windows is None else min(max_windows, (len(tokens) - 1) // seq)
    nats = negative_elbo(model, tokens, seq, windows=n, samples=2 if max_windows else 4)
    count = n * seq
    n_bytes = int(byte_lengths[tokens[:count]].sum())
    return {"loss": nats, "bits_per_byte": nats * count / math.log(2) / max(1, n_bytes), "tokens": count,
            "bytes": n_bytes, "bound": "masked-diffusion negative ELBO (an upper bound on the NLL)"}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at `step`: linear warm-up to cfg.lr, cosine decay to cfg.lr * cfg.min_lr_ratio."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    done = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done)))


def _autocast(device: torch.device):
    """bf16 autocast where bf16 is fast on this device; plain fp32 where it is a slow fallback (an AVX2-only CPU)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_is_fast(device))


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, byte_lengths: torch.Tensor, seq: int,
             max_windows: int | None = None) -> dict:
    """Validation loss over consecutive windows of `tokens`: nats per token and bits per byte of source text."""
    device = next(model.parameters()).device
    n = (len(tokens) - 1) // seq
    if n < 1:
        raise ValueError(f"need more than {seq} validation tokens, got {len(tokens)}")
    if max_windows is not None:
        n = min(n, max_windows)
    was_training = model.training
    model.eval()
    nats, count, n_bytes = 0.0, 0, 0
    for i in range(0, n, 8):
        rows = range(i, min(n, i + 8))
        x = torch.stack([tokens[r * seq:(r + 1) * seq] for r in rows]).to(device)
        y = torch.stack([tokens[r * seq + 1:(r + 1) * seq + 1] for r in rows]).to(device)
        with _autocast(device):
            logits = model(input_ids=x).logits.float()
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
        nats += nll.item()
        count += y.numel()
        n_bytes += int(byte_lengths[y.cpu()].sum())
    model.train(was_training)
    return {"loss": nats / count, "bits_per_byte": nats / math.log(2) / max(1, n_bytes), "tokens": count,
            "bytes": n_bytes}


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per token, in nats: the loss that pulls the draft's next-token distribution onto the
    target's (chapter 05: the acceptance rate is the overlap of the two)."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student and teacher logits differ in shape: {tuple(student_logits.shape)} vs "
                         f"{tuple(teacher_logits.shape)}")
    log_q = torch.log_softmax(student_logits.float().flatten(0, -2), -1)
    log_p = torch.log_softmax(teacher_logits.float().flatten(0, -2), -1)
    return torch.nn.functional.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def _save_atomic(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def train(spec: ModelSpec, cfg: TrainConfig, tokenizer, train_tokens: torch.Tensor, val_tokens: torch.Tensor,
          ckpt_dir: Path | None = None, *, resume: bool = True, device: str | torch.device | None = None,
          progress: bool = True, stop_after: int | None = None, init: dict | None = None, teacher=None):
    """Train one model from scratch (or resume its checkpoint); returns (model, log) (appendix A).

    `stop_after` ends the run after that many steps of this call (a checkpoint is written), to be resumed later.
    Distillation: `init` is a state dict to start from and `teacher` a model whose next-token distributions the
    model learns (loss: `distill_loss`) instead of the corpus's next tokens.
    """
    from transformers import LlamaForCausalLM
    from .device import as_device
    from tqdm.auto import tqdm
    if cfg.steps < 1 or cfg.batch < 1 or cfg.seq < 2:
        raise ValueError(f"steps, batch must be >= 1 and seq >= 2, got {cfg}")
    if cfg.seq > spec.context:
        raise ValueError(f"seq {cfg.seq} is longer than {spec.name}'s context {spec.context}")
    if len(train_tokens) <= cfg.seq + 1:
        raise ValueError(f"need more than {cfg.seq + 1} training tokens, got {len(train_tokens)}")
    device = as_device(device)
    torch.manual_seed(cfg.seed)
    if spec.kind == "diffusion":
        from .diffusion import MaskedDiffusionLM, diffusion_loss
        if teacher is not None:
            raise ValueError("a masked-diffusion model is trained on the corpus, not distilled")
        model = MaskedDiffusionLM(diffusion_config(spec, tokenizer)).to(device)
    else:
        model = LlamaForCausalLM(llama_config(spec, tokenizer)).to(device)
    if init is not None:
        model.load_state_dict(init)
    if teacher is not None:
        teacher = teacher.to(device).eval()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    byte_lengths = token_byte_lengths(tokenizer)
    log = {"model": spec.name, "spec": dataclasses.asdict(spec), "config": dataclasses.asdict(cfg),
           "params": sum(p.numel() for p in model.parameters()), "device": device_name(device),
           "torch": torch.__version__, "train": [], "val": [], "seconds": 0.0, "step": 0,
           "precision": "bf16 autocast" if bf16_is_fast(device) else "fp32",   # as _autocast chooses
           **({"objective": "distillation: KL(teacher || model) per token"} if teacher is not None else {}),
           **({"objective": "masked diffusion: 1/t-weighted cross-entropy on tokens masked with probability t"}
              if spec.kind == "diffusion" else {})}
    ckpt = ckpt_dir / "last.pt" if ckpt_dir else None
    if ckpt and resume and ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        if state["log"]["spec"] != log["spec"] or state["log"]["config"] != log["config"]:
            raise ValueError(f"{ckpt} was written for another spec or config; rerun with --fresh")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["rng"])
        log = state["log"]
    model.train()
    tokens_per_step = cfg.batch * cfg.seq
    bar = tqdm(range(log["step"], cfg.steps), initial=log["step"], total=cfg.steps, desc=spec.name,
               disable=not progress, unit="step")
    running, started = None, time.perf_counter() - log["seconds"]
    last = cfg.steps if stop_after is None else min(cfg.steps, log["step"] + stop_after)
    for step in bar:
        if step >= last:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        starts = torch.randint(0, len(train_tokens) - cfg.seq - 1, (cfg.batch,), generator=gen)
        x = torch.stack([train_tokens[s:s + cfg.seq] for s in starts.tolist()]).to(device)
        y = torch.stack([train_tokens[s + 1:s + cfg.seq + 1] for s in starts.tolist()]).to(device)
        with _autocast(device):
            if spec.kind == "diffusion":
                loss = diffusion_loss(model, x, gen)
            else:
                logits = model(input_ids=x).logits
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=x).logits
        if spec.kind == "diffusion":
            pass
        elif teacher is None:
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        else:
            loss = distill_loss(logits, teacher_logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        log["step"] = step + 1
        log["seconds"] = time.perf_counter() - started
        if log["step"] % 10 == 0 or log["step"] == cfg.steps:
            log["train"].append([log["step"], value])
            bar.set_postfix(loss=f"{running:.3f}")
        if log["step"] % cfg.eval_every == 0 or log["step"] == cfg.steps:
            ev = _evaluate(model, spec, val_tokens, byte_lengths, cfg.seq, cfg.eval_windows)
            log["val"].append([log["step"], ev["loss"], ev["bits_per_byte"]])
            bar.write(f"{spec.name} step {log['step']}: train {running:.3f}, val {ev['loss']:.3f} nats/token, "
                      f"{ev['bits_per_byte']:.3f} bits/byte")
        if ckpt and (log["step"] % cfg.ckpt_every == 0 or log["step"] in (cfg.steps, last)):
            _save_atomic({"model": model.state_dict(), "opt": opt.state_dict(), "rng": gen.get_state(),
                          "log": log}, ckpt)
    log["tokens_seen"] = log["step"] * tokens_per_step
    model.eval()
    return model, log


# --- shipping ---------------------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    """The SHA-256 of a file, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def portable_tokenizer_config(folder: Path) -> None:
    """Name the tokenizer class that transformers 4 and 5 both know (PreTrainedTokenizerFast; transformers 5 writes
    its own TokenizersBackend, which 4.x cannot load, as in Colab) and drop the loading flags it saved (appendix A)."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def export(model, tokenizer, out: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save a trained model in transformers' Llama format (safetensors, bf16) with its tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out)
    tokenizer.save_pretrained(out)
    portable_tokenizer_config(out)
    model.float()
    return out


def write_manifest(weights: Path, corpus: dict, logs: dict[str, dict], evals: dict[str, dict]) -> Path:
    """weights/manifest.json: checksums and sizes of every shipped file, the corpus, the training logs."""
    files = {p.relative_to(weights).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256(p)}
             for p in sorted(weights.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    path = weights / "manifest.json"
    kept = json.loads(path.read_text())["models"] if path.exists() else {}   # models not retrained this time
    kept = {name: entry for name, entry in kept.items() if name not in logs and (weights / name).is_dir()}
    manifest = {"corpus": corpus, "files": files, "models": {**kept, **{
        name: {**{k: v for k, v in log.items() if k not in ("train", "val")}, "final_val": evals.get(name),
               "train_curve": log["train"], "val_curve": log["val"]} for name, log in logs.items()}},
        "python": platform.python_version(), "retrain": "python -m book.train all --fresh"}
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def plot_loss(logs: dict[str, dict], path: Path | None = FIGURE):
    """Training and validation loss (nats per token) against step for each model; saved to `path` if given."""
    import matplotlib
    import matplotlib.pyplot as plt
    from .plots import apply_style
    apply_style()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, (name, log) in enumerate(logs.items()):
        color = matplotlib.colormaps["tab10"](i)
        train_curve = log.get("train") or log.get("train_curve")
        val_curve = log.get("val") or log.get("val_curve")
        steps, losses = zip(*[(s, l) for s, l in train_curve])
        ax.plot(steps, losses, color=color, alpha=0.45, lw=1, label=f"{name} train")
        ax.plot([v[0] for v in val_curve], [v[1] for v in val_curve], "o-", color=color, ms=4,
                label=f"{name} validation (first {EVAL_WINDOWS} windows)")
    ax.set_xlabel("optimizer step")
    top = ax.get_ylim()[1]
    ax.set_ylabel("loss (nats per token)" + ("\n(axis cut at 5: the first steps start higher)" if top > 5 else ""))
    ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]), top=min(top, 5.0))
    ax.legend(fontsize=8)
    ax.set_title("Training the book's code models on the Python standard library")
    fig.tight_layout()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


# --- the command line -------------------------------------------------------------------------------------------

def _prepare(out: Path, fresh: bool, vocab: int, shipped: Path | None = None):
    corpus = load_corpus()
    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists() and shipped is not None and (shipped / "tokenizer.json").exists():
        tok_dir = shipped          # train one model beside the shipped ones: with their tokenizer
    if (tok_dir / "tokenizer.json").exists() and not fresh:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        print(f"tokenizer: {tok_dir}", flush=True)
    else:
        print(f"training a {vocab}-token BPE on {len(corpus.train)} files ...", flush=True)
        tokenizer = train_tokenizer(list(corpus.train.values()), vocab)
        tokenizer.save_pretrained(tok_dir)
    train_tokens = encode(tokenizer, list(corpus.train.values()))
    val_tokens = encode(tokenizer, list(corpus.val.values()))
    print(f"corpus: Python {corpus.python_version}, {len(corpus.train)} train / {len(corpus.val)} val files, "
          f"{corpus.n_bytes('train'):,} / {corpus.n_bytes('val'):,} bytes, "
          f"{len(train_tokens):,} / {len(val_tokens):,} tokens", flush=True)
    return corpus, tokenizer, train_tokens, val_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m book.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["all", "tokenizer", *SPECS], help="what to train")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the shipped models' count)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: the best available)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where checkpoints and the exported models go (default: checkpoints/ and book/weights/)")
    parser.add_argument("--fresh", action="store_true", help="ignore existing checkpoints and tokenizer")
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args(argv)
    ckpts = (args.out / "checkpoints") if args.out else CHECKPOINTS
    weights = (args.out / "weights") if args.out else WEIGHTS
    corpus, tokenizer, train_tokens, val_tokens = _prepare(ckpts, args.fresh, args.vocab,
                                                           None if args.what == "all" else weights / "coder")
    if args.what == "tokenizer":
        return 0
    names = list(SPECS) if args.what == "all" else [args.what]
    logs, evals = {}, {}
    byte_lengths = token_byte_lengths(tokenizer)
    # From-scratch models first (cheapest first), then the distilled ones, which start from them.
    for name in sorted(names, key=lambda n: (n in DISTILLED, SPECS[n].flops_per_token(len(tokenizer)))):
        cfg = dataclasses.replace(CONFIGS[name], seed=args.seed, **({"steps": args.steps} if args.steps else {}))
        init = teacher = None
        if name in DISTILLED:
            from transformers import LlamaForCausalLM
            base, teacher_name = DISTILLED[name]
            init = LlamaForCausalLM.from_pretrained(weights / base, torch_dtype=torch.float32).state_dict()
            teacher = LlamaForCausalLM.from_pretrained(weights / teacher_name, torch_dtype=torch.float32)
            print(f"{name}: starts from {weights / base}, learns {teacher_name}'s next-token distributions",
                  flush=True)
        model, log = train(SPECS[name], cfg, tokenizer, train_tokens, val_tokens, ckpts / name,
                           resume=not args.fresh, device=args.device, init=init, teacher=teacher)
        if name in DISTILLED:
            log["distilled"] = {"from_weights_of": DISTILLED[name][0], "teacher": DISTILLED[name][1]}
        evals[name] = _evaluate(model, SPECS[name], val_tokens, byte_lengths, cfg.seq)
        print(f"{name}: {log['params']:,} parameters, {log['step']} steps in {log['seconds'] / 60:.1f} min; "
              f"validation {evals[name]['loss']:.3f} nats/token = {evals[name]['bits_per_byte']:.3f} bits/byte",
              flush=True)
        if SPECS[name].kind == "diffusion":
            from .diffusion import save
            save(model, weights / name, extra={"tokenizer": "the shipped coder's (book/weights/coder)"})
        else:
            export(model, tokenizer, weights / name)
        logs[name] = log
    write_manifest(weights, corpus.summary(), logs, evals)
    if args.what == "all":
        plot_loss({n: log for n, log in logs.items()          # the autoregressive models trained from scratch
                   if n not in DISTILLED and SPECS[n].kind != "diffusion"},
                  (args.out / "training_loss.png") if args.out else FIGURE)
    print(f"wrote {weights}" + (" and the loss curve" if args.what == "all" else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
