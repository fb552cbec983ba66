import os

import pytest
import torch

import book
from book import device


def test_pick_device_prefers_cpu_here_and_honours_override(monkeypatch):
    monkeypatch.setenv("BOOK_DEVICE", "cpu")
    assert device.pick_device() == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            device.pick_device("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        device.pick_device("xla")


def test_device_facts():
    assert "thread" in device.device_name("cpu")
    assert device.memory_bytes("cpu") > 2**30
    llc = device.last_level_cache_bytes("cpu")
    assert llc is None or llc >= 2**16
    device.synchronize("cpu")   # a no-op on the CPU, but must not fail


def test_setup_is_offline_seeded_and_prints(capsys, monkeypatch):
    monkeypatch.delenv("BOOK_ONLINE", raising=False)
    monkeypatch.setenv("BOOK_DEVICE", "cpu")
    dev = book.setup(seed=3, measure=False)
    out = capsys.readouterr().out
    assert dev == torch.device("cpu")
    assert "device: cpu" in out and "offline" in out
    refs = book.reference.load_references()       # the shipped reference devices are named, or their absence said
    assert all(r.device in out for r in refs) if refs else "no reference-GPU results" in out
    assert "Colab" in out                       # on the CPU it says how to get a GPU
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    import huggingface_hub.constants as c
    assert c.HF_HUB_OFFLINE is True
    a = torch.rand(3)
    book.setup(seed=3, measure=False, verbose=False)
    assert torch.equal(a, torch.rand(3))        # same seed, same numbers


def test_setup_prints_the_ceilings_table_unless_asked_not_to(monkeypatch, capsys):
    monkeypatch.setenv("BOOK_DEVICE", "cpu")
    measured = []
    fake = type("C", (), {"table": lambda self: "THE CEILINGS TABLE"})()
    monkeypatch.setattr(book.hardware, "measured_ceilings", lambda dev: measured.append(dev) or fake)
    book.setup(measure=True)
    assert "THE CEILINGS TABLE" in capsys.readouterr().out
    book.setup(measure=True, table=False)            # chapter 00 prints it under its own explanation
    assert "THE CEILINGS TABLE" not in capsys.readouterr().out and len(measured) == 2


def test_setup_online_opt_in(monkeypatch, capsys):
    monkeypatch.setenv("BOOK_DEVICE", "cpu")
    book.setup(online=True, measure=False)
    import huggingface_hub.constants as c
    assert c.HF_HUB_OFFLINE is False and "online" in capsys.readouterr().out
    book.setup(online=False, measure=False, verbose=False)
    assert c.HF_HUB_OFFLINE is True
