"""book.quant: weight-only int8/int4 layers agree with the dense product; the comparison runs (chapter 02)."""
import pytest
import torch

from book import quant
from book.roofline import Roof, linear
from book.timing import format_seconds


@pytest.mark.parametrize("precision,tol", [("fp32", 1e-2), ("bf16", 1e-2), ("int8", 2e-2), ("int4", 0.15)])
def test_quantized_layers_match_the_dense_product(precision, tol):
    torch.manual_seed(0)
    w = torch.randn(128, 256)
    layer = quant.quantize(w, precision)
    x = torch.randn(3, 256).to(layer.act_dtype)
    got, want = layer(x).float(), x.float() @ w.T
    assert (got - want).norm() / want.norm() < tol
    per_weight = {"fp32": 4, "bf16": 2, "int8": 1, "int4": 0.5}[precision]
    assert layer.nbytes >= 128 * 256 * per_weight and layer.nbytes < 128 * 256 * per_weight * 1.2


def test_bad_quantization_requests_are_refused():
    with pytest.raises(ValueError, match="unknown precision"):
        quant.quantize(torch.randn(64, 128), "int3")
    with pytest.raises(ValueError, match="2-D"):
        quant.quantize(torch.randn(64), "int8")
    with pytest.raises(ValueError, match="divisible"):
        quant.quantize(torch.randn(64, 100), "int4")
    with pytest.raises(ValueError, match="bf16 or fp16"):
        quant.quantize(torch.randn(64, 128), "int8", act_dtype=torch.float32)


def test_compare_linear_prints_every_precision_and_batch():
    lines = quant.compare_linear(256, 512, batches=(1, 8), device="cpu", roof=Roof("toy", 1e10, 1e11),
                                 repeats=1)
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["B", "weights"])
    rows = [line.split() for line in lines[header + 1:]]
    assert sorted((r[0], r[1]) for r in rows) == sorted((str(b), p) for b in (1, 8) for p in quant.PRECISIONS)
    bf16 = [r for r in rows if r[1] == "bf16"]
    assert all(r[-2] == "1.00x" for r in bf16)          # bf16 is the reference speed
    assert all(r[4] != "-" for r in rows)               # every row has its prediction (time and unit: 2 fields)


def test_int8_times_each_kernel_and_keeps_the_fastest(monkeypatch):
    w = torch.randn(128, 256)
    layer = quant.quantize(w, "int8")
    x = torch.randn(3, 256).to(torch.bfloat16)
    assert set(layer.kernels) == {"pack", "dequant"}
    torch.testing.assert_close(layer.kernels["dequant"](x).float(), layer.kernels["pack"](x).float(),
                               rtol=2e-2, atol=2e-2)
    # a packed kernel that fails on this device (as a GPU might): the dequantized product still gives the row
    monkeypatch.setattr(torch, "_weight_int8pack_mm", lambda *a: (_ for _ in ()).throw(RuntimeError("no kernel")))
    results = []
    lines = quant.compare_linear(256, 512, batches=(1,), device="cpu", precisions=("bf16", "int8"), repeats=1,
                                 results=results)
    assert "note: int8 kernel pack failed on this device (RuntimeError: no kernel); left out" in lines
    assert {r["precision"] for r in results} == {"bf16", "int8"}
    assert {r["precision"]: r["kernel"] for r in results}["int8"] == "dequant"   # the one left is named
    assert not any(line.startswith("int8 kernels at") for line in lines)    # one kernel left: nothing to choose


def test_compare_linear_names_the_int8_kernel_it_kept():
    lines = quant.compare_linear(256, 512, batches=(1,), device="cpu", precisions=("int8",), repeats=1)
    kept = [line for line in lines if line.startswith("int8 kernels at B=1:")]
    assert len(kept) == 1 and "pack" in kept[0] and "dequant" in kept[0] and "is kept" in kept[0]


def test_compare_linear_predicts_each_compute_precision_on_its_own_roof():
    slow_fp32, fast_bf16 = Roof("fp32", 1e10, 1e9), Roof("bf16", 1e10, 1e12)
    lines = quant.compare_linear(256, 512, batches=(64,), device="cpu", precisions=("fp32", "bf16"),
                                 roof={"fp32": slow_fp32, "bf16": fast_bf16}, repeats=1)
    pred = {line.split()[1]: line.split()[4:6] for line in lines if line.split()[:1] == ["64"]}
    fp32, bf16 = linear(64, 256, 512, "fp32", "fp32"), linear(64, 256, 512, "bf16", "bf16")
    assert pred["fp32"] == format_seconds(slow_fp32.time(fp32)).split()
    assert pred["fp32"] != format_seconds(fast_bf16.time(fp32)).split()     # the fp32 row did not use bf16's roof
    assert pred["bf16"] == format_seconds(fast_bf16.time(bf16)).split()


def _rows(lines):
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["B", "weights"])
    return [line.split() for line in lines[header + 1:] if line[:1] not in ("*", "n")]


def test_a_failing_int4_packing_kernel_leaves_one_note_and_the_other_rows(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no int4 kernel for this CPU\nsecond line of the error")

    monkeypatch.setattr(torch, "_convert_weight_to_int4pack_for_cpu", broken)
    lines = quant.compare_linear(256, 512, batches=(1, 8), device="cpu", repeats=1)
    notes = [line for line in lines if line.startswith("note:")]
    assert notes == ["note: int4 packing failed on this device (RuntimeError: no int4 kernel for this CPU); "
                     "int4 rows are left out"]
    rows = _rows(lines)
    assert sorted((r[0], r[1]) for r in rows) == sorted((str(b), p) for b in (1, 8) for p in ("fp32", "bf16", "int8"))


def test_a_missing_int4_matmul_kernel_is_a_note_too(monkeypatch):
    monkeypatch.delattr(torch, "_weight_int4pack_mm_for_cpu")          # an older torch without the kernel
    results = []
    lines = quant.compare_linear(256, 512, batches=(1,), device="cpu", repeats=1, results=results)
    notes = [line for line in lines if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: int4 packing failed on this device (AttributeError")
    assert notes[0].endswith("; int4 rows are left out")
    assert sorted(r["precision"] for r in results) == ["bf16", "fp32", "int8"]
    assert all(r["seconds"] > 0 and r["predicted"] is None for r in results)


def test_fallback_precisions_are_marked_and_results_carry_predictions():
    results = []
    lines = quant.compare_linear(256, 512, batches=(1,), device="cpu", precisions=("fp32", "bf16"), repeats=1,
                                 roof=Roof("toy", 1e10, 1e11), fallbacks=("bf16",), results=results)
    assert any(line.split()[:2] == ["1", "bf16*"] for line in lines)
    assert lines[-1] == ("* bf16: a slow fallback here (its matmul rate, in the ceilings table, is "
                         "under 1.25x fp32's)")
    assert {r["precision"] for r in results} == {"fp32", "bf16"}
    assert all(r["predicted"] == pytest.approx(1e-10 * r["nbytes"], rel=0.2) for r in results)


def test_a_kernel_that_fails_at_one_batch_is_timed_out_of_turn_with_a_note(monkeypatch):
    orig = torch._weight_int4pack_mm_for_cpu

    def flaky(x, *args, **kwargs):                       # packs and runs at B=1, fails at B=8
        if x.shape[0] == 8:
            raise RuntimeError("no kernel at this batch")
        return orig(x, *args, **kwargs)

    monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu", flaky)
    lines = quant.compare_linear(256, 512, batches=(1, 8), device="cpu", repeats=1)
    notes = [line for line in lines if line.startswith("note:")]
    assert notes[0] == "note: at B=8 the kernels were timed one at a time (one failed in turn)"
    assert notes[1].startswith("note: int4 kernel") and "failed on this device at B=8" in notes[1]
    rows = sorted((r[0], r[1]) for r in _rows(lines))
    assert rows == sorted([("1", p) for p in ("fp32", "bf16", "int8", "int4")]
                          + [("8", p) for p in ("fp32", "bf16", "int8")])


def test_compare_linear_times_a_sum_in_the_same_rounds_when_asked():
    results = []
    quant.compare_linear(256, 512, batches=(1, 8), device="cpu", repeats=1, results=results, read_bytes=2**20)
    by_batch = {}
    for r in results:
        assert r["read_bw"] > 0
        by_batch.setdefault(r["batch"], set()).add(r["read_bw"])
    assert all(len(v) == 1 for v in by_batch.values())          # one sum per batch's rounds, shared by its rows
    plain = []
    quant.compare_linear(256, 512, batches=(1,), device="cpu", repeats=1, results=plain)
    assert all("read_bw" not in r for r in plain)
    with pytest.raises(ValueError, match="read_bytes"):
        quant.compare_linear(256, 512, batches=(1,), device="cpu", read_bytes=-1)
