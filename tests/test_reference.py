import json
import subprocess
import sys

import pytest

from book import reference as ref


def _sample(device="NVIDIA H200", date="2026-11-20", kind="cuda"):
    return ref.Reference(device=device, kind=kind, date=date, torch="2.13.0", cuda="12.8",
                         suites={"00_how_to_use_this_book": {
                             "values": {"read_bw_gbs": 4100.0},
                             "series": {"read_bw_vs_size": {"x": [1024, 2048], "y": [10.0, 20.0],
                                                            "x_label": "bytes", "y_label": "GB/s"}}}})


def test_write_read_round_trip(tmp_path):
    path = ref.write(_sample(), tmp_path / "h200.json")
    back = ref.read(path)
    assert back.device == "NVIDIA H200" and back.values("00_how_to_use_this_book") == {"read_bw_gbs": 4100.0}
    assert back.series("00_how_to_use_this_book", "read_bw_vs_size") == ([1024, 2048], [10.0, 20.0])
    assert back.series("00_how_to_use_this_book", "missing") is None
    assert "NVIDIA H200" in back.label() and "2026-11-20" in back.label()


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d.update(format="other/2"), "not a reference file"),
    (lambda d: d.pop("device"), "missing field 'device'"),
    (lambda d: d["suites"]["00_how_to_use_this_book"]["values"].update(x="fast"), "finite number"),
    (lambda d: d["suites"]["00_how_to_use_this_book"]["series"]["read_bw_vs_size"].update(y=[1.0]), "equal length"),
])
def test_invalid_files_are_rejected(tmp_path, mutate, msg):
    data = _sample().to_json()
    mutate(data)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ref.ReferenceFormatError, match=msg):
        ref.read(p)
    p.write_text("{not json")
    with pytest.raises(ref.ReferenceFormatError, match="not valid JSON"):
        ref.read(p)


def test_latest_and_describe(tmp_path):
    suite = "00_how_to_use_this_book"
    assert ref.latest(suite, directory=tmp_path) is None
    assert "No reference-GPU results" in ref.describe(suite, directory=tmp_path)
    ref.write(_sample("NVIDIA A100-SXM4-80GB", "2026-01-01"), tmp_path / "a.json")
    ref.write(_sample("NVIDIA H200", "2026-11-20"), tmp_path / "b.json")
    ref.write(_sample("some CPU", "2026-12-01", kind="cpu"), tmp_path / "c.json")
    assert ref.latest(suite, directory=tmp_path).device == "NVIDIA H200"
    assert ref.latest(suite, kind="cpu", directory=tmp_path).device == "some CPU"
    assert "NVIDIA H200" in ref.describe(suite, directory=tmp_path)
    with pytest.raises(KeyError, match="registered suites"):
        ref.latest("99_nothing", directory=tmp_path)


def test_every_registered_suite_resolves():
    for name in ref.SUITES:
        assert callable(ref._resolve_suite(name))


def test_shipped_references_are_valid():
    for r in ref.load_references():
        assert r.kind in ("cuda", "mps", "cpu") and r.suites


def test_record_command_runs_the_real_suites(tmp_path):
    """`python -m book.reference record --quick` on this machine's CPU runs every registered suite (smaller sweeps)
    and writes one valid file, marked quick and never drawn; the ceilings it measures stay out of the build's file."""
    import os
    env = {**os.environ, "BOOK_CEILINGS": "off"}
    out = subprocess.run([sys.executable, "-m", "book.reference", "record", "--quick", "--device", "cpu",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    r = ref.read(files[0])
    assert r.kind == "cpu" and r.quick and set(r.suites) == set(ref.SUITES)
    assert r.values("00_how_to_use_this_book")["read_bw_gbs"] > 0
    assert r.values("01_serial_decoding")["decode_1024_ms"] > 0 and r.values("02_roofline")["decode_b1_ms"] > 0
    xs, ys = r.series("00_how_to_use_this_book", "read_bw_vs_size")
    assert len(xs) == len(ys) > 3 and all(y > 0 for y in ys)
    assert ref.load_references(tmp_path) == []             # a quick file is a check, never a reference
    with pytest.raises(ValueError, match="out_dir"):
        ref.record(["03_memory_breakdown"], quick=True)
    bad = subprocess.run([sys.executable, "-m", "book.reference", "record", "--quick"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--quick needs --out" in bad.stderr
    with pytest.raises(KeyError, match="unknown suite"):
        ref.record(["nope"], out_dir=tmp_path)
