import statistics
from dataclasses import replace

import pytest
import torch

from book import hardware as hw
from book import kernels as K


def test_catalog_has_the_gpus_the_book_uses():
    for name in ["A100 40GB", "A100 80GB", "H100 SXM", "H200", "L4", "T4", "A10G", "RTX 4090"]:
        spec = hw.gpu(name)
        assert spec.bandwidth_gbs > 0 and spec.memory_gb > 0 and spec.source
        assert all(v > 0 for v in spec.tflops.values())
    assert "bf16" not in hw.gpu("T4").tflops     # Turing has no bf16 tensor cores


def test_lookup_by_torch_names_and_aliases():
    assert hw.datasheet_for("NVIDIA H200").name == "H200"
    assert hw.datasheet_for("NVIDIA A100-SXM4-80GB").name == "A100 80GB"
    assert hw.datasheet_for("NVIDIA A100-SXM4-40GB").name == "A100 40GB"
    assert hw.datasheet_for("NVIDIA GeForce RTX 4090").name == "RTX 4090"
    assert hw.datasheet_for("Tesla T4").name == "T4"
    assert hw.datasheet_for("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert hw.datasheet_for("Some Laptop GPU") is None
    assert hw.gpu("h200") is hw.gpu("H200")


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(KeyError, match="known GPUs: A100 40GB, A100 80GB, H100 SXM, H200"):
        hw.gpu("B200")
    with pytest.raises(ValueError, match="non-empty"):
        hw.gpu("")


def test_ridge_points_from_datasheets():
    assert hw.gpu("A100 80GB").ridge_point("bf16") == pytest.approx(312e12 / 2039e9)
    assert hw.gpu("H200").ridge_point("bf16") == pytest.approx(989.4e12 / 4800e9)   # about 206 FLOP/byte
    with pytest.raises(ValueError, match="no bf16"):
        hw.gpu("T4").peak_flops("bf16")


def test_random_tensor_is_random_and_shaped():
    x = hw.random_tensor(3000, 1000)
    assert x.shape == (3000, 1000) and x.dtype == torch.float32
    assert x.std().item() == pytest.approx(1.0, rel=0.05) and (x != 0).float().mean() > 0.99
    assert hw.random_tensor(10, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="positive"):
        hw.random_tensor(0, 5)


def test_bandwidth_and_matmul_measurements_are_sane():
    bw, t = hw.measure_read_bandwidth(4 * 2**20, "cpu", repeats=3)
    assert 1e8 < bw < 1e13 and t.median > 0
    bw, _ = hw.measure_copy_bandwidth(4 * 2**20, "cpu", repeats=3)
    assert 1e8 < bw < 1e13
    rate, n, _ = hw.measure_matmul("fp32", "cpu", n=128, repeats=2)
    assert n == 128 and 1e6 < rate < 1e15
    with pytest.raises(ValueError, match="positive"):
        hw.measure_read_bandwidth(-5, "cpu")
    with pytest.raises(ValueError, match="unknown matmul precision"):
        hw.measure_matmul("fp64", "cpu")


def test_bandwidth_test_size_is_beyond_the_cache():
    size = hw.bandwidth_test_bytes("cpu")
    llc = hw.last_level_cache_bytes("cpu")
    assert size >= 256 * 2**20 and (llc is None or size >= min(4 * llc, hw.memory_bytes("cpu") // 8))
    sizes = hw.sweep_sizes("cpu")
    assert sizes[0] == 16 * 2**10 and sizes[-1] <= size and all(b > a for a, b in zip(sizes, sizes[1:]))


def test_measured_ceilings_are_cached_in_memory_and_in_the_build_file(monkeypatch, tmp_path):
    monkeypatch.setattr(hw, "bandwidth_test_bytes", lambda dev=None: 8 * 2**20)
    monkeypatch.setenv("BOOK_CEILINGS", str(tmp_path / "ceilings.json"))
    c1 = hw.measured_ceilings("cpu", dtypes=["fp32"], refresh=True, rounds=3)
    assert hw.measured_ceilings("cpu", dtypes=["fp32"]) is c1
    assert c1.decode_bw == c1.read_bw and c1.ridge_point("fp32") == c1.matmul["fp32"] / c1.read_bw
    # the read bandwidth is the fastest read measured: sum, or a matrix-vector product of the same bytes
    assert c1.read_bw == max(c1.read_sum_bw, c1.matvec_bw("fp32"))
    assert (c1.read_kernel == "sum") == (c1.read_sum_bw >= c1.matvec_bw("fp32"))
    assert len(c1.samples["read"]) == 3 and len(c1.samples["matmul fp32"]) == 3 and c1.spread("read") >= 0
    # the ceiling's path is the fastest over one large matrix, its rate the median of samples taken in turn with sum
    mv = c1.samples["matvec fp32"]
    assert len(mv) == 3 and c1.matvec_bw("fp32") == statistics.median(mv)
    assert c1.matvec_ceiling_path("fp32") == max(c1.matvec["fp32"], key=c1.matvec["fp32"].get)
    # the decoder's path is chosen over layer-sized matrices read in turn, and the kernel module uses it
    layer = c1.matvec_layer["fp32"]
    assert c1.matvec_path("fp32") == max(layer, key=layer.get) and set(layer) == set(c1.matvec["fp32"])
    assert K.matvec_path("cpu", torch.float32) == c1.matvec_path("fp32")
    few = c1.few_rows["fp32"]            # and the few-rows path, the same way
    assert set(few) == set(K.ROW_PATHS) and c1.rows_path("fp32") == max(few, key=few.get)
    assert K.rows_path("cpu", torch.float32) == c1.rows_path("fp32")
    rows = c1.samples["rows fp32"]       # sampled in the same rounds as the one-row layers, its rate their median
    assert len(rows) == len(c1.samples["layers fp32"]) == 3 and c1.rows_bw("fp32") == statistics.median(rows)
    K.set_rows_path("cpu", torch.float32, "linear" if c1.rows_path("fp32") == "wx" else "wx")
    hw._CEILINGS.clear()                                     # a new kernel of the same build reads the file
    c2 = hw.measured_ceilings("cpu", dtypes=["fp32"])
    assert c2.read_bw == c1.read_bw and c2.matmul == c1.matmul and c2.cache_file == str(tmp_path / "ceilings.json")
    assert c2.read_kernel == c1.read_kernel and c2.matvec_layer == c1.matvec_layer and c2.few_rows == c1.few_rows
    assert K.rows_path("cpu", torch.float32) == c1.rows_path("fp32")   # restored from the file
    costs = c2.matvec_costs("fp32")               # each path's fixed cost a call, with its layer rate
    assert costs and set(costs) == set(layer) and all(f >= 0 and r > 0 for f, r in costs.values())
    assert c2.matvec_call == c1.matvec_call and K._COSTS[("cpu", torch.float32)] == costs
    assert K.matvec_path("cpu", torch.float32, 2**20) == K.cheapest(costs, 2**20)
    table = c2.table()
    for needle in ("read bandwidth", "matmul fp32", "none in the catalog", "matrix-vector fp32",
                   "range (n)", "shared by every chapter"):
        assert needle in table, needle


def test_the_decoders_path_follows_layer_sized_matrices_not_the_ceiling():
    # as on an H100: a generated kernel streams one 2 GB matrix fastest but loses on 4096-row layers
    c = hw.Ceilings(device="gpu-x", kind="cuda", read_bw=3e12, copy_bw=3e12, bytes_tested=1,
                    matmul={"bf16": 7e14}, matmul_sizes={"bf16": 1},
                    matvec={"bf16": {"mv": 2.8e12, "mulsum": 3.0e12}},
                    matvec_layer={"bf16": {"mv": 0.89e12, "mulsum": 0.35e12}})
    assert c.matvec_ceiling_path("bf16") == "mulsum" and c.matvec_bw("bf16") == 3.0e12
    assert c.matvec_path("bf16") == "mv"
    assert "matrix-vector bf16 (mulsum)" in c.table() and "4096-row layers (mv)" in c.table()
    assert hw.Ceilings.from_json(c.to_json()).matvec_layer == c.matvec_layer
    old = {k: v for k, v in c.to_json().items() if k != "matvec_layer"}   # a cache file from before the field
    assert hw.Ceilings.from_json(old).matvec_path("bf16") == "mulsum"
    assert c.rows_path("bf16") == "linear"                               # nothing measured: the plain product
    assert c.matvec_costs("bf16") is None                                # no fixed costs measured: one path
    c = replace(c, matvec_call={"bf16": {"mv": 5e-6, "mulsum": 2e-5}})
    # a 4096-row bf16 call's time holds the fixed cost once: the rate beyond it is the bytes over the rest
    size = 4096 * 4096 * 2
    costs = c.matvec_costs("bf16")
    assert set(costs) == {"mv", "mulsum"} and costs["mv"][0] == 5e-6 and costs["mulsum"][0] == 2e-5
    assert costs["mv"][1] == pytest.approx(size / (size / 0.89e12 - 5e-6))
    assert costs["mulsum"][1] == pytest.approx(size / (size / 0.35e12 - 2e-5))
    assert c.layer_call("bf16") == (pytest.approx(size / 0.89e12), 5e-6)
    # where the fixed cost is most of such a call (a GPU's launches), the one-matrix rate stands in
    gpu = replace(c, matvec_call={"bf16": {"mv": 30e-6, "mulsum": 2e-5}})
    assert gpu.matvec_costs("bf16")["mv"] == (30e-6, 2.8e12)
    assert "rates set by each call's fixed cost" in gpu.table() and "bf16: a 4096-row call 37.7 µs, a small weight's 30.0 µs" \
        in gpu.table()
    assert "fixed cost more than" not in c.table()        # 5 of 37.7 us: a rate set by memory
    assert hw.call_bound((40e-6, 20e-6)) and not hw.call_bound((40e-6, 19e-6)) and not hw.call_bound(None)
    assert replace(c, matvec_call={}).layer_call("bf16") is None
    assert "1 MiB weights (mv, est.)" in c.table() and "est.: from the path's fixed cost" in c.table()
    assert hw.Ceilings.from_json(c.to_json()).matvec_call == c.matvec_call
    c = replace(c, few_rows={"bf16": {"linear": 1e11, "wx": 3e11}})
    assert c.rows_path("bf16") == "wx" and "batch 4 and 16 (wx)" in c.table()
    assert "above the one-matrix ceiling" not in c.table()
    assert "when the paths were compared" not in c.table()          # no layer samples: one measurement
    assert not c.row_blocks("bf16") and "rows of 11008" not in c.table()      # long rows not measured: whole
    long = replace(c, long_rows={"bf16": {"whole": 20e9, "blocks": 40e9}})
    assert long.row_blocks("bf16") and "rows of 11008 in blocks of 2752" in long.table()
    assert "as blocks\n  in bf16 (2.00x),\n  where blocks streamed faster" in long.table()
    assert hw.Ceilings.from_json(long.to_json()).long_rows == long.long_rows
    assert not replace(c, long_rows={"bf16": {"whole": 20e9, "blocks": 21e9}}).row_blocks("bf16")
    moved = replace(c, samples={**c.samples, "layers bf16": (0.6e12, 0.62e12, 0.61e12)})
    assert "when the paths were compared:\n  bf16 (mv): 610.0 and 890.0 GB/s" in moved.table()
    assert "range (the est. row of bf16 uses the second)" in moved.table()    # its 1 MiB row: the compared rate
    assert "est. row" not in replace(moved, matvec_call={}).table()           # no est. row to point at
    faster = replace(c, matvec_layer={"bf16": {"mv": 3.1e12, "mulsum": 0.35e12}})  # sampled at a quicker moment
    assert "bf16: 4096-row layers above the one-matrix ceiling" in faster.table()
    both = replace(c, samples={**c.samples, "layers bf16": (0.88e12, 0.89e12, 0.9e12),       # the same rounds
                               "matvec bf16": (0.5e12, 0.52e12, 0.51e12)})
    assert "bf16: 4096-row layers read in turn streamed faster than one large matrix\n  in every round" in both.table()
    assert "different moments" not in both.table()
    mixed = replace(both, samples={**both.samples, "matvec bf16": (0.5e12, 0.95e12, 0.51e12)})
    assert "than one large matrix" not in mixed.table() and "different moments" not in mixed.table()  # noise
    assert hw.Ceilings.from_json(c.to_json()).few_rows == c.few_rows


def test_a_low_precision_no_faster_than_fp32_is_labelled_a_fallback():
    c = hw.Ceilings(device="cpu-x", kind="cpu", read_bw=1e10, copy_bw=1e10, bytes_tested=1,
                    matmul={"fp32": 1e12, "bf16": 3e12, "fp16": 2e11},
                    matmul_sizes={"fp32": 1, "bf16": 1, "fp16": 1})
    assert c.fallbacks == ["fp16"] and "slow fallback" in c.table() and c.fastest() == "bf16"
    back = hw.Ceilings.from_json(c.to_json())
    assert back.matmul == c.matmul and back.read_bw == c.read_bw


def _decode_ceilings(layer: dict[str, dict[str, float]], matmul: dict[str, float] | None = None) -> hw.Ceilings:
    matmul = matmul or {"fp32": 1e11, "bf16": 1.4e10, "fp16": 1.6e10}
    return hw.Ceilings(device="cpu-x", kind="cpu", read_bw=2e10, copy_bw=2e10, bytes_tested=1, matmul=matmul,
                       matmul_sizes={d: 1 for d in matmul}, matvec=layer, matvec_layer=layer)


def test_decode_precision_is_chosen_by_weights_streamed_not_by_matmul_rate():
    # as on an AVX2-only CPU: bf16 matmul is a slow fallback, but a bf16 one-row product streams 1.6x the weights
    c = _decode_ceilings({"fp32": {"mulsum": 17e9, "mv": 15e9}, "bf16": {"mv": 13.7e9}, "fp16": {"mv": 15e9}})
    assert c.fastest() == "fp32" and c.fallbacks == ["bf16", "fp16"]
    assert c.weights_per_s("fp32") == 17e9 / 4 and c.weights_per_s("bf16") == 13.7e9 / 2
    assert c.decode_dtype() == "bf16"                      # fp16 streams 1.09x bf16's: below the switch margin
    text = c.decode_text()
    assert text.startswith("batch-1 decode precision: bf16, 6.85 G weights/s in one-row products on 4096-row layers")
    assert "(fp16 7.50, fp32 4.25; another replaces bf16 only at 1.25x)" in text
    assert "batch-1 decode precision: bf16" in c.table() and "slow fallback" in c.table()
    # fp16 replaces bf16 only when it streams DECODE_SWITCH x as many weights
    c = _decode_ceilings({"bf16": {"mv": 10e9}, "fp16": {"mv": 10e9 * hw.DECODE_SWITCH}, "fp32": {"mv": 20e9}})
    assert c.decode_dtype() == "fp16"
    # a bf16 path that streams far below fp32 (a CPU with a poor bf16 one-row kernel): fp32 decodes faster
    c = _decode_ceilings({"bf16": {"linear": 3e9}, "fp32": {"linear": 16e9}})
    assert c.decode_dtype() == "fp32" and c.decode_text().endswith("fp32, 4.00 G weights/s in one-row products on "
                                                                   "4096-row layers (bf16 1.50)")
    # a T4: no bf16 measured, fp16 reads half fp32's bytes at the same rate
    c = _decode_ceilings({"fp32": {"mv": 2.5e11}, "fp16": {"mv": 2.6e11}}, {"fp32": 8e12, "fp16": 6.5e13})
    assert c.decode_dtype() == "fp16" == c.fastest()
    # samples of the layers taken in turn with the other precisions come first, and the table prints their range
    c = _decode_ceilings({"bf16": {"mv": 13e9}, "fp16": {"mv": 20e9}, "fp32": {"mv": 16e9}})
    assert c.decode_dtype() == "fp16"                      # fp16's own measurement: 1.54x bf16's
    c = replace(c, samples={"layers bf16": (12e9, 13e9, 14e9), "layers fp16": (12.5e9, 13.5e9, 14.5e9),
                            "layers fp32": (15e9, 16e9, 17e9)})
    assert c.layer_bw("fp16") == 13.5e9 and c.decode_dtype() == "bf16"   # side by side: within the margin
    assert "  4096-row layers (mv)             13.5 GB/s     15% (3)" in c.table()
    assert ("batch-1 decode precision: bf16, 6.50 G weights/s\n  in one-row products on 4096-row layers\n"
            "  (fp16 6.75, fp32 4.00; another replaces bf16 only at 1.25x)\n") in c.table()
    # nothing measured: the matmul choice, said so
    c = _decode_ceilings({})
    assert c.decode_dtype() == "fp32" and "no one-row product measured" in c.decode_text()
    with pytest.raises(ValueError, match="no matrix-vector rate measured for bf16"):
        c.weights_per_s("bf16")


def test_ceilings_file_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("BOOK_CEILINGS", "off")
    assert hw.ceilings_file() is None
    monkeypatch.delenv("BOOK_CEILINGS")
    assert hw.ceilings_file().name == "ceilings.json"


def test_bf16_is_fast_only_when_it_beats_fp32_by_the_fallback_margin(monkeypatch):
    monkeypatch.setattr(hw, "_BF16_FAST", {})
    monkeypatch.setattr(hw, "_CEILINGS", {})
    rates = {"fp32": 1e11, "bf16": 1e9}                  # an AVX2-only CPU: bf16 is a slow fallback
    monkeypatch.setattr(hw, "measure_matmul", lambda d, dev, n, repeats: (rates[d], n, None))
    assert hw.bf16_is_fast("cpu") is False
    rates["bf16"] = 5e11                                 # measured once per device and process
    assert hw.bf16_is_fast("cpu") is False
    hw._BF16_FAST.clear()
    assert hw.bf16_is_fast("cpu") is True
    hw._BF16_FAST.clear()                                # measured ceilings, when there are some, decide
    hw._CEILINGS["k"] = hw.Ceilings(device="cpu-x", kind="cpu", read_bw=1e10, copy_bw=1e10, bytes_tested=1,
                                    matmul={"fp32": 1e11, "bf16": 1.1e11}, matmul_sizes={"fp32": 1, "bf16": 1})
    assert hw.bf16_is_fast("cpu") is False


def test_a_slow_rate_keeps_its_digits_in_gflops():
    c = hw.Ceilings(device="cpu-x", kind="cpu", read_bw=1e10, copy_bw=1e10, bytes_tested=1,
                    matmul={"fp32": 1.2e11, "bf16": 1.23e9}, matmul_sizes={"fp32": 1, "bf16": 1})
    t = c.table()
    assert "120 GFLOP/s" in t and "1.23 GFLOP/s" in t and "TFLOP/s" not in t   # one unit for both rows
    assert "bf16 0.01x the fp32 rate;\n  below 1.25x the fp32 rate a precision is never chosen" in t
    assert max(len(line) for line in t.splitlines()) <= 85      # fits the book's output column
    fast = hw.Ceilings(device="cpu-x", kind="cpu", read_bw=1e10, copy_bw=1e10, bytes_tested=1,
                       matmul={"fp32": 1.2e11, "bf16": 2.5e11}, matmul_sizes={"fp32": 1, "bf16": 1}).table()
    assert "0.120 TFLOP/s" in fast and "0.250 TFLOP/s" in fast and "fallback" not in fast
    assert c.matmul_text("bf16") == "1.23 GFLOP/s" and c.matmul_text("fp32") == "120 GFLOP/s"   # chapter 02's lines


def test_matmul_size_grows_while_a_slow_path_is_still_speeding_up(monkeypatch):
    """A slow path times well at n = 256 but is far from its peak there: the search goes on while the rate rises
    and the next product stays short, and stops at once for a rate that is already flat."""
    def fake_time_fn(rates):
        def time_fn(fn, **kw):
            n = next(c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, torch.Tensor)).shape[0]
            return hw.Timing(times=(2 * n**3 / rates(n),), device="cpu")
        return time_fn
    rising = {256: 1e9, 512: 5e9, 1024: 20e9, 2048: 21e9, 4096: 21e9}
    monkeypatch.setattr(hw, "time_fn", fake_time_fn(rising.get))
    assert hw.measure_matmul("fp32", "cpu")[1] == 1024     # 1024 -> 2048 would take 8 x 107 ms
    monkeypatch.setattr(hw, "time_fn", fake_time_fn(lambda n: 1e9))
    assert hw.measure_matmul("fp32", "cpu")[1] == 512      # flat: one doubling to see that it is
    monkeypatch.setattr(hw, "time_fn", fake_time_fn(lambda n: 1e12))
    assert hw.measure_matmul("fp32", "cpu")[1] == 4096     # fast: 17 ms at 2048 is not long enough yet


def test_a_cache_from_before_the_current_measurements_is_measured_again(tmp_path, monkeypatch):
    import json
    monkeypatch.setenv("BOOK_CEILINGS_MAX_AGE_H", "0")
    dev = torch.device("cpu")
    key = hw._cache_key(dev, ["fp32"])
    assert key.endswith(f" | v{hw.CEILINGS_VERSION}")
    c = hw.Ceilings(device="cpu-x", kind="cpu", read_bw=1e10, copy_bw=1e10, bytes_tested=1,
                    matmul={"fp32": 1e11}, matmul_sizes={"fp32": 1})
    path = tmp_path / "ceilings.json"
    old_key = key.rsplit(" | v", 1)[0]            # how a file written before the version was keyed
    path.write_text(json.dumps({old_key: c.to_json()}))
    assert hw._load_cached(key, path) is None
    path.write_text(json.dumps({key: c.to_json()}))
    assert hw._load_cached(key, path).read_bw == 1e10


def test_the_table_says_when_sum_reads_far_below_a_matrix_vector_product_of_the_same_rounds():
    def ceil(sum_gbs, mv_gbs):
        read, kernel = max((sum_gbs, "sum"), (mv_gbs, "matrix-vector bf16, mv"))
        return hw.Ceilings(device="cpu-x", kind="cpu", read_bw=read * 1e9, copy_bw=30e9, bytes_tested=2**28,
                           matmul={"bf16": 1e12}, matmul_sizes={"bf16": 1024}, read_kernel=kernel,
                           samples={"read": (sum_gbs * 1e9,) * 3, "matvec bf16": (mv_gbs * 0.9e9, mv_gbs * 1e9,
                                                                                 mv_gbs * 1.1e9)},
                           matvec={"bf16": {"mv": 50e9}})
    far = ceil(30.0, 45.0)
    assert far.matvec_bw("bf16") == 45e9 and far.read_samples == "matvec bf16"       # the median, not the 50
    assert "sum read 30.0 GB/s" in far.table() and "1.50x as fast" in far.table()
    assert "20% (3)" in far.table().splitlines()[1]                 # the read row carries the product's range
    assert "sum read" not in ceil(40.0, 45.0).table()                 # within 1.25x: the rows say enough
    assert "sum read" not in ceil(45.0, 40.0).table() and ceil(45.0, 40.0).read_samples == "read"


def test_a_rate_sampled_later_is_called_moved_only_beyond_the_ceilings_range():
    c = hw.Ceilings(device="cpu-x", kind="cpu", read_bw=40e9, copy_bw=30e9, bytes_tested=1, matmul={"fp32": 1e11},
                    matmul_sizes={"fp32": 1}, samples={"read": (38e9, 40e9, 42e9)})    # range 10%
    assert c.moved(40e9) is None and c.moved(43.9e9) is None            # within max(10%, the range)
    assert c.moved(30e9) == pytest.approx(-0.25) and c.moved(50e9, floor=0.3) is None
    drift, text = c.beside_text(60e9, "the predictions")               # 1.5x the ceilings' sum
    assert drift == pytest.approx(0.5) and "60.0 GB/s" in text and "1.50x as fast" in text
    assert "the predictions (from the ceilings) are for a machine slower" in text
    still, text = c.beside_text(41e9, "x")                              # within the range: no drift line
    assert still is None and "as fast" not in text
    _, text = c.beside_text(20e9, "the predictions", beside="the sweep")  # named where it was sampled
    assert "beside the sweep (sum" in text and "faster\nthan this one was during the sweep" in text


def test_read_probe_adds_a_sum_to_functions_timed_in_turn():
    assert hw.read_probe(0, "cpu") == {}
    probe = hw.read_probe(2**20, "cpu")
    assert list(probe) == ["read"] and float(probe["read"]()) != 0.0
    with pytest.raises(ValueError, match="read_bytes"):
        hw.read_probe(-1, "cpu")
