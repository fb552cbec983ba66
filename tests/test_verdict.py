"""book.verdict: every branch of every helper, driven by contrasting numbers (as different devices would give)."""
import pytest

from book import verdict as V


def test_compare_takes_each_branch():
    assert V.compare(100, 95, what="step", unit="ms").outcome == "agrees"
    above = V.compare(200, 100, what="step", unit="ms", above="the kernel streams below the read bandwidth")
    assert above.outcome == "above" and "a ratio of 2.00: above the prediction" in above.text
    assert "streams below" in above.text
    below = V.compare(50, 100, what="step", unit="ms", below="the cache holds the weights")
    assert below.outcome == "below" and "a ratio of 0.50: below the prediction" in below.text
    assert "cache holds" in below.text
    noisy = V.compare(130, 100, what="step", unit="ms", spread=0.6)
    assert noisy.outcome == "noisy" and "cannot tell" in noisy.text
    # a spread smaller than the gap does not hide a real difference
    assert V.compare(300, 100, what="step", spread=0.3).outcome == "above"
    assert bool(V.compare(1, 1, what="x")) and not bool(V.compare(3, 1, what="x"))


def test_ratio_bound_trend_pick_say():
    assert V.ratio(10, 10.5, a_name="book", b_name="HF").outcome == "agrees"
    assert V.ratio(20, 10, a_name="book", b_name="HF").outcome == "above"
    below = V.ratio(5, 10, a_name="book", b_name="HF", what="tokens per second")
    assert below.outcome == "below" and below.text == "book has 0.50x the tokens per second of HF (1/2.00)."
    assert V.ratio(12, 10, a_name="book", b_name="HF", spread=0.5).outcome == "noisy"
    assert V.bound(0.9, 0.01).outcome == "memory-bound"
    assert V.bound(0.2, 0.8).outcome == "compute-bound"
    assert V.bound(0.2, 0.05).outcome == "neither"
    assert V.trend([16, 2048], [73, 111], what="step time", x_name="context").outcome == "rises"
    assert V.trend([16, 2048], [73, 75], what="step time", x_name="context").outcome == "flat"
    assert V.trend([1, 2], [10, 5], what="y", x_name="x").outcome == "falls"
    # a zigzag larger than the net change, or a change inside the spread, is not a trend
    assert V.trend([16, 512, 1024, 2048], [117, 244, 160, 161], what="y", x_name="x").outcome == "noisy"
    assert V.trend([1, 2], [100, 130], what="y", x_name="x", spread=0.4).outcome == "noisy"
    assert V.trend([1, 2, 3], [100, 120, 140], what="y", x_name="x", spread=0.1).outcome == "rises"
    p = V.pick(0.12, [(lambda v: v < 0.1, "well below a tenth ({v:.2f})"), (lambda v: v < 0.2, "near ({v:.2f})")],
               otherwise="above ({v:.2f})", outcome_names=["below", "near"])
    assert p.outcome == "near" and "0.12" in p.text
    assert V.pick(0.5, [(lambda v: v < 0.1, "x")], otherwise="above {v}").outcome == "fails"
    assert V.say(True, "yes {a:.1f}", "no", a=2).text == "yes 2.0" and V.say(False, "y", "no").outcome == "fails"


def test_verdicts_render_as_markdown_and_reject_bad_input():
    v = V.compare(1, 1, what="x")
    assert v._repr_markdown_().startswith("**On this device:**") and str(v) == v.text
    for bad in (float("nan"), "3", None):
        with pytest.raises(ValueError, match="finite number"):
            V.compare(bad, 1, what="x")
    with pytest.raises(ValueError, match="predicted > 0"):
        V.compare(1, 0, what="x")
    with pytest.raises(ValueError, match="positive"):
        V.ratio(0, 1, a_name="a", b_name="b")
    with pytest.raises(ValueError, match=">= 0"):
        V.bound(-1, 0)
    with pytest.raises(ValueError, match="equal-length"):
        V.trend([1], [1], what="y", x_name="x")


def test_compare_can_name_a_reference_that_is_not_a_prediction():
    v = V.compare(60, 40, what="first call", unit="ms", against="the median", above="one-off costs")
    assert "the median 40.0 ms" in v.text and "above the median" in v.text and "predicted" not in v.text


def test_compare_names_a_value_derived_from_a_measurement():
    v = V.compare(8.57, 7.63, what="TTFT of the full model", unit="s", measured_name="scaled")
    assert v.text.startswith("TTFT of the full model: scaled 8.57 s, predicted 7.63 s") and "measured" not in v.text


def test_a_factor_of_two_below_counts_as_far_as_a_factor_of_two_above():
    assert V.compare(15.4, 31.3, what="B=1 product", spread=0.52).outcome == "below"
    assert V.compare(62.6, 31.3, what="B=1 product", spread=0.52).outcome == "above"


def test_bound_names_the_bandwidth_it_was_measured_against():
    v = V.bound(0.9, 0.01, what="a step", against="the read bandwidth sampled beside the steps (23.0 GB/s)")
    assert v.outcome == "memory-bound" and "sampled beside the steps (23.0 GB/s)" in str(v)
    assert "the measured read bandwidth" in str(V.bound(0.9, 0.01))


def test_bound_explains_a_share_above_one():
    over = V.bound(0.03, 1.18, what="a pass")
    assert over.outcome == "compute-bound" and "118%" in over.text and "not the hardware's limit" in over.text
    assert "and 3.0% of" in over.text and "reaches only 29% of" in V.bound(0.29, 0.103).text   # as tables print
    assert "one benchmark" in V.bound(1.08, 0.01).text
    assert "drifts" not in V.bound(0.9, 0.01).text and "drifts" not in V.bound(0.2, 0.8).text


def test_a_unit_with_a_leading_space_prints_one_space():
    v = V.compare(5.39, 2.53, what="an 8-token pass", unit=" steps", against="at batch 1")
    assert "5.39 steps" in v.text and "  steps" not in v.text


def test_values_a_hair_apart_do_not_print_a_gap_that_rounding_made():
    assert "measured 207.5 GFLOP, predicted 207.5 GFLOP" in V.compare(207.5, 207.48, what="x", unit="GFLOP").text
    assert "measured 207.5 GFLOP, predicted 207.3 GFLOP" in V.compare(207.5, 207.3, what="x", unit="GFLOP").text
    # rounding that at most doubles a real gap keeps three figures: no fourth figure the noise cannot support
    assert "measured 208 GFLOP, predicted 207 GFLOP" in V.compare(207.5, 206.9, what="x", unit="GFLOP").text
    assert "measured 22.4 ms, predicted 22.5 ms" in V.compare(22.43, 22.49, what="x", unit="ms").text
    assert "measured 208 GFLOP, predicted 150 GFLOP" in V.compare(207.5, 150, what="x", unit="GFLOP").text
    assert "measured 150 ms, predicted 150 ms" in V.compare(150.04, 150.1, what="x", unit="ms").text
    assert "measured 7.68 s, predicted 4.14 s" in V.compare(7676, 4144, what="x", unit="ms").text
    assert "measured 86.9 ms, predicted 1,306 ms" in V.compare(86.9, 1306, what="x", unit="ms").text   # one under 1 s: ms
    assert "measured 1.58 s, predicted 998 ms" not in V.compare(1577, 998, what="x", unit="ms").text
    assert "measured 40.6 s, predicted 33.9 s" in V.compare(40643, 33937, what="x", unit="ms").text
    assert "measured 11.0 s, predicted 9.50 s" in V.compare(11000, 9500, what="x", unit="ms").text   # one unit


def test_a_ratio_unit_prints_after_the_number_as_the_book_writes_it():
    assert "measured 1.22x, predicted 1.28x" in V.compare(1.22, 1.28, what="speed-up", unit="x").text


def test_a_verdict_continues_the_on_this_device_sentence_in_lower_case_but_keeps_names_and_acronyms():
    md = lambda text: V.say(True, text, "")._repr_markdown_()
    assert md("The exact rule passed.") == "**On this device:** the exact rule passed."
    assert md("At batch 16 the gain fades.") == "**On this device:** at batch 16 the gain fades."
    assert md("Hugging Face's step is slower.").endswith(":** Hugging Face's step is slower.")
    assert md("As a model of the text it is better.") == "**On this device:** as a model of the text it is better."
    assert md("Pinsker's bound holds.") == "**On this device:** Pinsker's bound holds."
    assert md("HF generate takes 1.2x.").endswith(":** HF generate takes 1.2x.")
    assert md("TTFT P95 meets it.").endswith(":** TTFT P95 meets it.")
    assert md("the step grows.").endswith(":** the step grows.")
    assert str(V.say(True, "The exact rule passed.", "")) == "The exact rule passed."   # the text itself is kept


def test_a_trend_is_flat_only_when_every_point_is():
    v = V.trend([4.4, 8.8, 13.2], [32.5, 21.7, 24.5], what="P95 TPOT", x_name="rate", unit="ms", flat=0.25)
    assert v.outcome == "falls" and "not flat" in v.text and "21.7 ms" in v.text
    assert V.trend([1, 2, 3], [10, 11, 10.5], what="y", x_name="x").outcome == "flat"


def test_a_verdict_on_numbers_from_elsewhere_names_their_source():
    v = V.ratio(1.9, 1.1, a_name="the bound", b_name="the loss", what="bits per byte")
    v = v.labelled("From the training record")
    assert v._repr_markdown_().startswith("**From the training record:** the bound has 1.73x")
    assert V.say(True, "x", "")._repr_markdown_().startswith("**On this device:**")
    with pytest.raises(ValueError, match="label"):
        v.labelled(" ")


def test_a_rise_through_a_higher_middle_point_names_the_peak():
    v = V.trend([4.3, 8.6, 13.0], [13.0, 22.2, 18.1], what="P95 TPOT", x_name="rate", unit="ms", flat=0.25)
    assert v.outcome == "rises" and "peaking at 22.2 ms at rate = 8.6 on the way" in v.text
    assert "peaking" not in V.trend([1, 2, 3], [10, 15, 20], what="t", x_name="n").text
    assert "dipping to 5.00 at n = 2" in V.trend([1, 2, 3], [20, 5, 12], what="t", x_name="n").text


def test_trailing_zeros_are_kept_so_a_verdict_reads_like_the_table_beside_it():
    v = V.compare(22.0, 19.8, what="sweep", unit="GB/s", tol=0.2, against="read bandwidth")
    assert "measured 22.0 GB/s" in v.text and "read bandwidth 19.8 GB/s" in v.text
    assert V._fmt(99.96, "ms") == "100 ms" and V._fmt(2.4, "s") == "2.40 s"


def test_compare_names_where_its_tolerance_comes_from():
    v = V.compare(21, 19.8, what="sweep", unit="GB/s", tol=0.41, tol_name="the samples' full range")
    assert v.outcome == "agrees" and "within 41% (the samples' full range)." in v.text
    assert "(" not in V.compare(21, 19.8, what="sweep", tol=0.41).text.split("within")[1]


def test_bound_gives_reasons_that_fit_the_predicted_roof():
    assert "below the peak rate" in V.bound(0.03, 0.45, roof="compute").text
    assert "stream below the memory's speed" in V.bound(0.3, 0.01).text


def test_inversions_finds_a_larger_size_timed_faster_beyond_the_margin():
    sizes, times = [1, 2, 4, 8], [10.0, 9.0, 12.0, 11.5]
    assert V.inversions(sizes, times) == [(1, 2), (4, 8)]                  # strict: any drop counts
    assert V.inversions(sizes, times, tol=0.05) == [(1, 2)]                 # 11.5 is within 5% of 12.0
    assert V.inversions(sizes, times, tol=[0.0, 0.2, 0.0, 0.0]) == [(4, 8)]  # a pair takes the larger spread
    assert V.inversions(sizes, [1.0, 2.0, 3.0, 4.0]) == [] and V.inversions([1], [1.0]) == []
    with pytest.raises(ValueError, match="one time"):
        V.inversions(sizes, times[:3])
    with pytest.raises(ValueError, match="ascending"):
        V.inversions([2, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="fractions"):
        V.inversions(sizes, times, tol=1.5)


def test_a_time_a_hair_under_a_second_prints_in_seconds():
    assert "1.00 s" in V.compare(999.96, 990.0, unit="ms", what="t").text


def test_compare_prints_at_least_the_digits_asked_for():
    assert "measured 1.12, recorded 1.12" in V.compare(1.1221, 1.1219, what="bpb", tol=0.02, against="recorded").text
    v = V.compare(1.1221, 1.1219, what="bpb", tol=0.02, against="recorded", digits=4)
    assert "measured 1.122, recorded 1.122" in v.text and v.outcome == "agrees"
    with pytest.raises(ValueError, match="digits >= 1"):
        V.compare(1.0, 1.0, what="x", digits=0)



def test_large_ratios_print_three_significant_figures():
    assert "a ratio of 19.2:" in V.compare(192.0, 10.0, what="rise", tol=0.2).text
    assert "a ratio of 1.85:" in V.compare(18.5, 10.0, what="rise", tol=0.2).text
    assert "(11.9x)" in V.trend([1, 2], [1.0, 11.86], what="step", x_name="batch").text


def test_a_share_that_rounds_to_ten_percent_prints_as_ten_percent():
    assert "uses 10% of" in V.bound(0.71, 0.0998).text and "uses 9.9% of" in V.bound(0.71, 0.099).text
    assert [V.pct(x) for x in (1.17, 0.24, 0.0998, 0.021, 0.0012, 0.00042, 0.0)] == [
        "117%", "24%", "10%", "2.1%", "0.1%", "0.042%", "0.0%"]
    graph = V.bound(0.49, 0.0004, what="the step", causes="kernels that stream below the memory's speed")
    assert graph.outcome == "neither" and "(kernels that stream below the memory's speed)" in graph.text
    assert "0.04% of the matmul rate" in graph.text
    assert [V._ratio(r) for r in (0.0383, 0.914, 13.0, 19.2, 1234.5)] == ["0.038", "0.91", "13.0", "19.2", "1,234"]


def test_factors_from_ten_print_three_significant_figures():
    t = V.compare(12.82, 8.92, what="pass / step", unit="x", tol=0.15).text
    assert "measured 12.8x, predicted 8.92x" in t


def test_a_zigzag_inside_the_flat_band_is_flat_not_noisy():
    # the H200's coder steps: 4.22 .. 4.46 .. 4.14 .. 4.36 ms over a 64x range of batch
    v = V.trend([1, 4, 16, 64], [4.22, 4.46, 4.14, 4.36], what="step", x_name="batch", unit="ms", flat=0.5)
    assert v.outcome == "flat" and "stays within 50%" in v.text
    assert V.trend([1, 4, 16, 64], [4.22, 9.0, 2.0, 4.36], what="step", x_name="batch", flat=0.5).outcome == "noisy"


def test_bound_shows_the_digit_that_decides_near_its_threshold():
    v = V.bound(0.498, 0.01, what="HF")
    assert v.outcome == "neither" and "49.8%" in v.text and "under the 50% this book counts as bound" in v.text


def test_compare_shows_the_digit_that_decides_on_its_tolerance():
    v = V.compare(0.1915, 0.153, what="decode peak", tol=0.25)
    assert "a ratio of 1.252" in v.text and v.outcome == "above"
