import pytest

from book.timing import Timing, format_seconds, time_fn, time_in_turn, time_unit


def test_timing_statistics():
    t = Timing(times=(1.0, 2.0, 3.0, 4.0, 100.0))
    assert t.median == 3.0
    assert t.mean == pytest.approx(22.0)
    assert t.min == 1.0 and t.max == 100.0
    assert t.iqr == pytest.approx(2.0)          # quartiles 2 and 4
    assert t.quartiles == (pytest.approx(2.0), pytest.approx(4.0))
    assert t.spread == pytest.approx(2.0 / 3.0)
    assert "3.00 s median" in str(t)


def test_timing_needs_a_repeat():
    with pytest.raises(ValueError, match="at least one"):
        Timing(times=())


def test_time_fn_counts_warmup_and_repeats():
    calls = []
    t = time_fn(lambda: calls.append(1), device="cpu", warmup=2, repeats=5, number=3)
    assert len(calls) == 2 + 5 * 3
    assert len(t.times) == 5 and t.number == 3 and all(x >= 0 for x in t.times)


def test_time_fn_calibrates_short_work():
    t = time_fn(lambda: None, device="cpu", warmup=1, repeats=3, number=None, min_repeat_s=1e-3)
    assert t.number > 100            # a no-op is far shorter than a millisecond
    assert t.median < 1e-4


def test_time_fn_measures_real_time():
    import time
    t = time_fn(lambda: time.sleep(0.01), device="cpu", warmup=0, repeats=3)
    assert 0.009 < t.median < 0.1


@pytest.mark.parametrize("kwargs", [dict(repeats=0), dict(warmup=-1), dict(number=0)])
def test_time_fn_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        time_fn(lambda: None, device="cpu", **kwargs)


def test_format_seconds():
    assert format_seconds(2.5e-6) == "2.50 µs"
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(3.0) == "3.00 s" and format_seconds(0.030) == "30.0 ms"   # as precise as 44.3 ms
    assert format_seconds(0.99996) == "1.00 s" and format_seconds(999.6e-6) == "1.00 ms"
    assert format_seconds(123.4) == "123 s" and format_seconds(4321) == "4,321 s"


def test_time_unit_is_judged_after_rounding():
    assert time_unit(0.5e-3) == (1e-6, "µs") and time_unit(0.0123) == (1e-3, "ms") and time_unit(2.0) == (1.0, "s")
    assert time_unit(0.99996) == (1.0, "s")                   # 999.96 ms rounds to 1.00e3 ms at three figures
    assert time_unit(0.99996, digits=5) == (1e-3, "ms")       # and stays 999.96 ms at five
    assert time_unit(-0.0123) == (1e-3, "ms")



def test_time_in_turn_interleaves_rounds_after_warmup():
    order = []
    ts = time_in_turn({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, warmup=1, rounds=3)
    assert order == ["a", "b"] + ["a", "b"] * 3          # warm each once, then one call of each per round
    assert set(ts) == {"a", "b"} and all(len(t.times) == 3 for t in ts.values())


def test_time_in_turn_spreads_a_drifting_machine_over_every_function():
    import time
    slow = {"n": 0}

    def drifting():                       # each call slower than the one before: a machine slowing down
        slow["n"] += 1
        time.sleep(0.002 * slow["n"])
    ts = time_in_turn({"x": drifting, "y": drifting}, warmup=0, rounds=4)
    assert ts["x"].median < ts["y"].median < 1.5 * ts["x"].median   # timed one after the other: 2x apart


@pytest.mark.parametrize("kwargs", [{"fns": {}}, {"fns": {"a": print}, "rounds": 0},
                                    {"fns": {"a": print}, "warmup": -1}])
def test_time_in_turn_rejects_bad_arguments(kwargs):
    fns = kwargs.pop("fns")
    with pytest.raises(ValueError):
        time_in_turn(fns, **kwargs)
