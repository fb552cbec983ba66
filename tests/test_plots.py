"""book.plots: the shared figure helpers."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from book.plots import bytes_ticks, format_bytes, label_points, plain_log_ticks  # noqa: E402


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


def test_a_narrow_log_axis_labels_every_minor_tick():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3.5, 4.7, 6.0])              # 3.5-6 ms: at 2 and 5 only "5" would show
    ax.set_yscale("log")
    plain_log_ticks(ax)
    minor = ax.yaxis.get_minor_formatter()
    assert minor(4, 0) == "4" and minor(6, 0) == "6" and minor(3, 0) == "3"
    assert 2.8 < ax.get_ylim()[0] < 3                  # lowered to show the 3 under 3.5
    plt.close(fig)
    for lo, hi, every in [(12.9, 46.5, True), (3, 60, False), (1, 1e4, False)]:   # 12.9-46.5: only "20" at 2 and 5
        fig, ax = plt.subplots()
        ax.plot([1, 2], [lo, hi])
        ax.set_yscale("log")
        plain_log_ticks(ax)
        assert (ax.yaxis.get_minor_formatter()(30, 0) == "30") is every, (lo, hi)
        plt.close(fig)


def test_format_bytes():
    assert format_bytes(512) == "512 B" and format_bytes(1.5 * 2**30) == "1.5 GiB"


def test_a_byte_axis_labels_its_largest_size():
    assert bytes_ticks(16 * 2**10, 512 * 2**20) == [2**14, 2**17, 2**20, 2**23, 2**26, 2**29]   # 16 KiB ... 512 MiB
    assert bytes_ticks(16 * 2**10, 700 * 2**20)[-1] == 512 * 2**20 and bytes_ticks(1, 1) == [1]
    with pytest.raises(ValueError, match="lo <= hi"):
        bytes_ticks(2**20, 2**10)


def test_label_points_skips_a_label_crowding_the_last_one():
    fig, ax = plt.subplots()
    ax.set(xscale="log", yscale="log")
    # B=128 and B=256 a tenth of a decade apart on both axes: the second label would print over the first
    drawn = label_points(ax, [10, 100, 120, 1000], [1e12, 1e14, 1.2e14, 3e14], ["B=1", "B=128", "B=256", "B=4096"])
    assert drawn == ["B=1", "B=128", "B=4096"]
    with pytest.raises(ValueError, match="x, y > 0"):
        label_points(ax, [0], [1], ["bad"])
    plt.close(fig)


def test_a_label_that_would_run_into_the_last_one_goes_over_its_point():
    # the H200's sweep: B=1024 and B=4096 on the flat compute roof, 0.3 decades apart: the labels ran together
    fig, ax = plt.subplots(figsize=(4.6, 4))
    ax.set(xscale="log", yscale="log", xlim=(0.3, 3e3), ylim=(1e11, 3e15))
    label_points(ax, [681, 1362], [7.7e14, 7.5e14], ["B=1024", "B=4096"])
    offsets = {a.get_text(): a.xyann[1] for a in ax.texts}
    assert offsets["B=1024"] < 0 < offsets["B=4096"]
    fig2, ax2 = plt.subplots(figsize=(9, 4))                   # far apart: both under their points
    ax2.set(xscale="log", yscale="log", xlim=(0.3, 3e3), ylim=(1e11, 3e15))
    label_points(ax2, [1, 1000], [7.7e14, 7.5e14], ["B=1", "B=4096"])
    assert all(a.xyann[1] < 0 for a in ax2.texts)
    plt.close(fig)
    plt.close(fig2)


def test_a_label_goes_over_a_point_at_the_bottom_of_the_axes():
    fig, ax = plt.subplots()
    ax.plot([1, 10, 100], [1e9, 1e10, 1e11], "o")
    ax.set(xscale="log", yscale="log")
    label_points(ax, [1, 100], [1e9, 1e11], ["B=1", "B=64"])
    offsets = {a.get_text(): a.xyann for a in ax.texts}
    assert offsets["B=1"][1] > 0 and offsets["B=64"][1] < 0     # the lowest point's label above it
    plt.close(fig)


def test_a_log_axis_is_lowered_to_show_a_label_under_its_lowest_point():
    fig, ax = plt.subplots()
    ax.plot([16, 32, 64], [10.7, 21.6, 42.2])        # the view starts just above 10: no label under 10.7
    ax.set_yscale("log")
    plain_log_ticks(ax)
    assert ax.get_ylim()[0] < 10 <= 10.7
    fig2, ax2 = plt.subplots()
    ax2.plot([1, 2], [95.0, 1000.0])                 # 50 is over 1.5x under the bottom: left as it is
    ax2.set_yscale("log")
    bottom = ax2.get_ylim()[0]
    plain_log_ticks(ax2)
    assert ax2.get_ylim()[0] == bottom
    plt.close(fig)
    plt.close(fig2)
