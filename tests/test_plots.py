"""book.plots: the shared figure helpers."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from book.plots import bytes_ticks, format_bytes, plain_log_ticks  # noqa: E402


def test_a_log_axis_is_labelled_in_plain_numbers_at_2_and_5_of_each_decade():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 4, 8], [150, 300, 700, 1500])
    ax.set_yscale("log")
    plain_log_ticks(ax)
    major, minor = ax.yaxis.get_major_formatter(), ax.yaxis.get_minor_formatter()
    assert major(100, 0) == "100" and major(1000, 0) == "1000" and major(0.1, 0) == "0.1"
    assert minor(200, 0) == "200" and minor(500, 0) == "500" and minor(0.05, 0) == "0.05"
    assert minor(300, 0) == "" and minor(700, 0) == ""
    with pytest.raises(ValueError, match="axis must be"):
        plain_log_ticks(ax, "z")
    plain_log_ticks(ax, "y", scale=1e9)            # FLOP/s labelled in GFLOP/s
    assert ax.yaxis.get_major_formatter()(1e11, 0) == "100" and ax.yaxis.get_minor_formatter()(2e10, 0) == "20"
    plain_log_ticks(ax, "x", minor=False)          # many decades: label the decades only
    assert ax.xaxis.get_major_formatter()(1000, 0) == "1000" and ax.xaxis.get_minor_formatter()(200, 0) == ""
    plt.close(fig)


def test_format_bytes():
    assert format_bytes(512) == "512 B" and format_bytes(1.5 * 2**30) == "1.5 GiB"


def test_a_byte_axis_labels_its_largest_size():
    assert bytes_ticks(16 * 2**10, 512 * 2**20) == [2**14, 2**17, 2**20, 2**23, 2**26, 2**29]   # 16 KiB ... 512 MiB
    assert bytes_ticks(16 * 2**10, 700 * 2**20)[-1] == 512 * 2**20 and bytes_ticks(1, 1) == [1]
    with pytest.raises(ValueError, match="lo <= hi"):
        bytes_ticks(2**20, 2**10)
