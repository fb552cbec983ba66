from book.exercises import check_choice, check_number


def test_check_number(capsys):
    assert check_number(10.2, 10.0, rel_tol=0.05, unit="ms")
    assert "✓" in capsys.readouterr().out
    assert not check_number(20, 10.0)
    assert "✗" in capsys.readouterr().out
    assert not check_number(10_000, 10.0)
    assert "units" in capsys.readouterr().out      # a factor of 1000 hints at units
    assert not check_number(None, 10.0, unit="ms")
    assert "Replace None" in capsys.readouterr().out
    assert not check_number("ten", 10.0)
    assert "should be a number" in capsys.readouterr().out
    assert not check_number(float("nan"), 10.0)


def test_check_choice(capsys):
    options = {"a": "first", "b": "second"}
    assert check_choice("B", "b", options)
    assert not check_choice("a", "b", options)
    out = capsys.readouterr().out
    assert "second" in out and "first" in out
    assert not check_choice("z", "b", options)
    assert "not an option" in capsys.readouterr().out
    assert not check_choice(None, "b", options)


def test_feedback_fits_an_exercise_box(capsys):
    long = {"a": "Decode is memory-bound, so its time follows the weight bytes, which int4 cuts to a quarter "
                 "of bf16's, and so on for a while longer than one line."}
    check_choice("a", "a", long)
    assert all(len(line) <= 82 for line in capsys.readouterr().out.splitlines())
