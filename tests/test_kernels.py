"""book.kernels: every matrix-vector path computes w @ x, the measured choice is used by the decoder, and a path
that fails on a device (forced here) is left out with its reason instead of a traceback."""
import pytest
import torch

from book import kernels as K
from book.llama import linear


@pytest.fixture(autouse=True)
def _clean_choice():
    saved, saved_rows, saved_costs = dict(K._CHOICE), dict(K._ROWS_CHOICE), dict(K._COSTS)
    saved_blocks = dict(K._BLOCKS)
    yield
    K._BLOCKS.clear()
    K._BLOCKS.update(saved_blocks)
    K._COSTS.clear()
    K._COSTS.update(saved_costs)
    K._SIZED.clear()                 # derived from the costs
    K._CHOICE.clear()
    K._CHOICE.update(saved)
    K._ROWS_CHOICE.clear()
    K._ROWS_CHOICE.update(saved_rows)


@pytest.mark.parametrize("path", ["linear", "mv", "mulsum"])
def test_every_path_computes_w_times_x(path):
    w, x = torch.randn(64, 32), torch.randn(32)
    torch.testing.assert_close(K.matvec(w, x, path), w @ x, rtol=1e-4, atol=1e-4)


def test_measurement_chooses_the_fastest_and_the_decoder_uses_it(monkeypatch):
    r = K.measure_matvec(4 * 2**20, "cpu", torch.float32, repeats=2, paths=("linear", "mv"))
    assert set(r) == {"linear", "mv"} and r.best in r and all(v > 0 for v in r.values())
    assert K.matvec_path("cpu", torch.float32) == r.best
    K.set_matvec_path("cpu", torch.float32, "mv")
    calls = []
    monkeypatch.setattr(K, "matvec", lambda w, x, p: calls.append(p) or torch.mv(w, x))
    w = torch.randn(8, 4)
    linear(torch.randn(1, 1, 4), w)           # one row: the chosen path
    linear(torch.randn(3, 1, 4), w)           # three rows: a matrix-matrix product, never the matvec path
    assert calls == ["mv"]
    assert "the fastest here" in K.describe("cpu", torch.float32, {"mv": 2e9, "linear": 1e9})


def test_layer_sized_measurement_reads_several_matrices_in_turn(monkeypatch):
    seen = []
    real = K.matvec
    monkeypatch.setattr(K, "matvec", lambda w, x, p: seen.append(w.data_ptr()) or real(w, x, p))
    r = K.measure_matvec(4 * 2**20, "cpu", torch.float32, repeats=1, paths=("linear",), rows=64, k=1024,
                         choose=False)
    assert set(r) == {"linear"} and r["linear"] > 0
    assert len(set(seen)) == 16          # 4 MiB of fp32 rows of 1024 in matrices of 64 rows: 16 distinct matrices
    with pytest.raises(ValueError, match="rows per matrix"):
        K.measure_matvec(2**20, "cpu", torch.float32, rows=0)


def test_a_failing_path_is_left_out_with_its_reason(monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("no C++ compiler (forced by the test)")
    monkeypatch.setattr(torch, "compile", broken)
    K._COMPILED.clear()
    r = K.measure_matvec(2 * 2**20, "cpu", torch.float32, repeats=1)
    assert "mulsum" not in r and "no C++ compiler" in r.failed["mulsum"] and r.best in ("linear", "mv")
    assert "torch.compile is not usable here" in capsys.readouterr().err


def test_bad_names_are_rejected():
    with pytest.raises(ValueError, match="unknown matrix-vector path"):
        K.set_matvec_path("cpu", torch.float32, "gemv9")
    with pytest.raises(ValueError, match="unknown matrix-vector path"):
        K.matvec(torch.ones(2, 2), torch.ones(2), "gemv9")
    with pytest.raises(ValueError, match="positive"):
        K.measure_matvec(0, "cpu")


def test_the_compiled_path_serves_many_shapes_and_falls_back_when_it_fails(monkeypatch, capsys):
    # a decoder has more weight shapes than torch.compile's recompile limit (8) allows static graphs for
    for n in range(1, 13):
        w, x = torch.randn(8 * n, 16), torch.randn(16)
        torch.testing.assert_close(K.matvec(w, x, "mulsum"), w @ x, rtol=1e-4, atol=1e-4)
    K.set_matvec_path("cpu", torch.float32, "mulsum")

    def broken(w, x):
        raise RuntimeError("recompile limit (forced by the test)")
    monkeypatch.setattr(K, "mulsum", broken)
    w, x = torch.randn(8, 4), torch.randn(4)
    torch.testing.assert_close(K.matvec(w, x, "mulsum"), w @ x)
    assert K.matvec_path("cpu", torch.float32) == "linear"
    assert "using F.linear from now on" in capsys.readouterr().err


def test_mulsum_compiles_a_models_weights_once_for_all_shapes_not_once_per_parameter():
    # nn.Parameters keep static sizes under torch.compile: each weight shape would compile anew and, past the
    # recompile limit, fall back to the eager w * x, a temporary as large as the weight (seen on an H100)
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(64)
    for n in (96, 128, 160, 192, 224, 256, 288, 320, 352, 384):
        w = torch.nn.Parameter(torch.randn(n, 64))
        torch.testing.assert_close(K.mulsum(w, x), w.detach() @ x, rtol=1e-4, atol=1e-4)
    assert counters["stats"]["unique_graphs"] <= 3


def test_mulsum_compiles_each_precision_once_per_row_length_whatever_shape_it_meets_first():
    # the ceilings meet each precision at one large matrix first, then at layers, small weights and rows of 11008:
    # with sizes static at first, three precisions took 9 graphs, past the recompile limit (8), and the rest ran
    # the eager w * x (2.8 GB/s over rows of 11008 on a Zen 4, against 18 compiled)
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    for rows, k in ((512, 128), (64, 128), (8, 32), (64, 4160)):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            w, x = torch.randn(rows, k).to(dtype), torch.randn(k).to(dtype)
            torch.testing.assert_close(K.mulsum(w, x).float(), (w.float() @ x.float()), rtol=2e-2, atol=2e-1)
            # then as a decoder calls it: the vector a view of a batch's activations, with autograd on and off
            acts = torch.randn(2, 3, k).to(dtype)
            with torch.no_grad():
                K.mulsum(w, acts[1, 2])
            K.mulsum(w, acts[0, 1])
    assert counters["stats"]["unique_graphs"] <= 6          # each precision: rows up to 4096 long, and longer


@pytest.mark.parametrize("path", ["linear", "wx"])
def test_every_few_rows_path_computes_x_times_w_transposed(path):
    w, x = torch.randn(64, 32), torch.randn(5, 32)
    y = K.few_rows(w, x, path)
    assert y.is_contiguous() and y.shape == (5, 64)
    torch.testing.assert_close(y, x @ w.T, rtol=1e-4, atol=1e-4)


def test_few_rows_measurement_chooses_the_faster_and_the_decoder_uses_it_for_2_to_32_rows(monkeypatch):
    rates = K.measure_rows("cpu", torch.float32, nbytes=2 * 2**20, k=256, n=512, rows=(2, 4), repeats=2)
    assert set(rates) == set(K.ROW_PATHS) and all(v > 0 for v in rates.values())
    assert K.rows_path("cpu", torch.float32) == max(rates, key=rates.get)
    K.set_rows_path("cpu", torch.float32, "wx")
    calls = []
    real = K.few_rows
    monkeypatch.setattr(K, "few_rows", lambda w, x, p: calls.append((x.shape[0], p)) or real(w, x, p))
    w = torch.randn(48, 16)
    for rows in (0, 1, 2, 32, 33):
        x = torch.randn(1, rows, 16)
        torch.testing.assert_close(linear(x, w), x @ w.T, rtol=1e-4, atol=1e-4)
    assert calls == [(2, "wx"), (32, "wx")]          # none or one row: not these paths; 33: F.linear
    with pytest.raises(ValueError, match="few-rows path"):
        K.set_rows_path("cpu", torch.float32, "magic")
    with pytest.raises(ValueError, match="few-rows path"):
        K.few_rows(w, torch.randn(2, 16), "magic")


def test_each_weight_takes_the_path_quickest_for_its_size(monkeypatch):
    # as on a 2-thread EPYC: the compiled path streams fastest but pays ~0.1 ms a call (its guards), so a small
    # model's layers are quicker through F.linear and a 7B model's through the compiled product
    costs = {"linear": (12e-6, 15e9), "mv": (10e-6, 16e9), "mulsum": (110e-6, 20e9)}
    K.set_matvec_costs("cpu", torch.float32, costs)
    assert K.matvec_path("cpu", torch.float32, 320 * 320 * 4) == "mv"
    assert K.matvec_path("cpu", torch.float32, 4096 * 4096 * 4) == "mulsum"
    assert K.cheapest(costs, 2**20) == "mv" and K.cheapest(costs, 2**30) == "mulsum"
    assert "weights of 1 MiB take mv" in K.describe("cpu", torch.float32, {"mulsum": 2e10, "linear": 1.6e10})
    calls = []
    monkeypatch.setattr(K, "matvec", lambda w, x, p: calls.append(p) or torch.mv(w, x))
    linear(torch.randn(1, 1, 320), torch.randn(320, 320))
    linear(torch.randn(1, 1, 4096), torch.randn(4096, 4096))
    assert calls == ["mv", "mulsum"]
    K.set_matvec_path("cpu", torch.float32, "linear")        # an explicit choice replaces the per-size costs
    assert K.matvec_path("cpu", torch.float32, 4096 * 4096 * 4) == "linear"
    with pytest.raises(ValueError, match="fixed cost"):
        K.set_matvec_costs("cpu", torch.float32, {"mv": (-1.0, 1e9)})
    with pytest.raises(ValueError, match="unknown matrix-vector path"):
        K.set_matvec_costs("cpu", torch.float32, {"gemv9": (0.0, 1e9)})


def test_the_fixed_cost_a_call_is_measured_on_a_small_weight_and_a_failing_path_is_left_out(monkeypatch):
    fixed = K.measure_call_cost(("linear", "mv"), "cpu", torch.float32, repeats=2)
    assert set(fixed) == {"linear", "mv"} and all(0 < f < 0.1 for f in fixed.values())

    def broken(*a, **k):
        raise RuntimeError("no C++ compiler (forced by the test)")
    monkeypatch.setattr(K, "mulsum", broken)
    assert set(K.measure_call_cost(("linear", "mulsum"), "cpu", torch.float32, repeats=1)) == {"linear"}


def test_the_bench_names_the_path_each_weight_takes_at_its_size():
    from dataclasses import replace
    from book.bench import one_row_paths
    from book.llama import Llama
    from book.models import architecture, build_random
    tiny = replace(architecture("Llama-2-7B"), name="tiny", n_layers=1, hidden=64, n_heads=4, n_kv_heads=2,
                   head_dim=16, intermediate=128, vocab=256)
    model = Llama.from_hf(build_random(tiny, dtype="fp32", device="cpu"))   # the choices set below are the CPU's
    # the compiled product pays 24 us a call and streams twice as fast: it wins from about 47 KiB, so the 64 KiB
    # gate/up weight and LM head take it, the 16-32 KiB q/k/v, output and down weights F.linear
    K.set_matvec_costs("cpu", torch.float32, {"linear": (0.0, 1e9), "mulsum": (24e-6, 2e9)})
    assert one_row_paths(model) == ("linear+mulsum", "linear on 3 and mulsum on 2 of the 5 weight matrices (each "
                                    "by its size)")
    K.set_matvec_costs("cpu", torch.float32, {"linear": (0.0, 1e9), "mulsum": (1.0, 2e9)})
    assert one_row_paths(model) == ("linear", "linear on all 5 weight matrices")


def test_block_width_is_the_widest_multiple_of_64_up_to_4096_that_divides_the_row():
    assert K.block_width(11008) == 2752 and K.block_width(14336) == 3584 and K.block_width(8192) == 4096
    assert K.block_width(4096) is None and K.block_width(4097) is None      # short enough; no divisor
    w = torch.randn(6, 4160)
    wb = K.to_blocks(w, 832)
    assert wb.shape == (5, 6, 832) and wb.is_contiguous() and torch.equal(K.from_blocks(wb), w)
    with pytest.raises(ValueError, match="does not divide"):
        K.to_blocks(w, 1000)


@pytest.mark.parametrize("rows", [1, 4, 40])
def test_a_blocked_weight_multiplies_like_the_whole_one(rows):
    w, x = torch.randn(48, 4160), torch.randn(2, rows, 4160)[:1]
    torch.testing.assert_close(K.blocked_linear(x, K.to_blocks(w, 832)), torch.nn.functional.linear(x, w),
                               rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(linear(x, K.to_blocks(w, 832)), x @ w.T, rtol=1e-4, atol=1e-3)   # the decoder's
    K.set_rows_path("cpu", torch.float32, "wx")                  # a few rows with the weight on the left
    torch.testing.assert_close(K.blocked_linear(x, K.to_blocks(w, 832)), x @ w.T, rtol=1e-4, atol=1e-3)


def test_blocks_are_measured_on_a_cpu_only_and_chosen_where_faster(monkeypatch, capsys):
    K._BLOCKS.clear()                # nothing measured before this test (the fixture restores what was)
    r = K.measure_blocks("cpu", torch.float32, nbytes=2**20, shape=(64, 4160), repeats=2)
    assert set(r) == {"whole", "blocks"} and min(r.values()) > 0
    assert K.row_blocks("cpu", torch.float32, 4160) == (832 if r["blocks"] >= K.BLOCKS_PAY * r["whole"] else None)
    assert K.measure_blocks("cpu", torch.float32, shape=(64, 4096)) == {}          # rows short enough
    K.set_row_blocks("cpu", torch.float32, True)
    assert K.row_blocks("cpu", torch.float32, 4160) == 832 and K.row_blocks("cpu", torch.float32, 4096) is None
    assert K.row_blocks("cpu", torch.bfloat16, 4160) is None                      # not measured: rows stay whole
    # a compiled product that fails falls back to the same sum in eager PyTorch, with one line
    monkeypatch.setattr(K, "_BLOCKED", [])
    monkeypatch.setattr(torch, "compile", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no compiler")))
    w, x = torch.randn(8, 4160), torch.randn(4160)
    torch.testing.assert_close(K.blocked_linear(x, K.to_blocks(w, 832)), w @ x, rtol=1e-4, atol=1e-3)
    assert "compiled blocked product failed" in capsys.readouterr().err


def test_the_decoder_stores_long_rows_as_blocks_where_measured_faster_and_computes_the_same():
    from dataclasses import replace
    from book.bench import one_row_paths
    from book.llama import Llama
    from book.models import architecture, build_random
    tiny = replace(architecture("Llama-2-7B"), name="tiny", n_layers=1, hidden=64, n_heads=4, n_kv_heads=2,
                   head_dim=16, intermediate=4160, vocab=256)
    hf = build_random(tiny, dtype="fp32", device="cpu")         # blocks are set for the CPU below
    K._BLOCKS.clear()                # nothing measured: rows stay whole
    whole = Llama.from_hf(hf)
    K.set_row_blocks("cpu", torch.float32, True)
    blocked = Llama.from_hf(hf)
    assert whole.blocks[0].w_down.shape == (64, 4160) and blocked.blocks[0].w_down.shape == (5, 64, 832)
    assert blocked.weight_bytes_per_step() == whole.weight_bytes_per_step()
    assert "mulsum over column blocks on 1" in one_row_paths(blocked)[1]
    x = torch.randint(3, 256, (1, 12))
    for m in (whole, blocked):
        m.setup_cache(1, 32)
    torch.testing.assert_close(blocked.prefill(x), whole.prefill(x), rtol=1e-4, atol=1e-4)
    tok = torch.tensor([5])
    torch.testing.assert_close(blocked.decode_step(tok), whole.decode_step(tok), rtol=1e-4, atol=1e-4)
