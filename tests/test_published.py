"""Published GPU measurements (chapters 01, 02, 04, 05, 06): the shipped file is valid, every entry is drawn by the chapters
it names, its derived figures agree with the book's own counts, and a bad file is refused with a message."""
import copy
import json
from pathlib import Path

import pytest

from book import published as P
from book import roofline as R

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def shipped() -> dict:
    return json.loads(P.PATH.read_text())


def test_every_entry_is_sourced_and_drawn_by_the_chapters_it_names():
    entries = P.load()
    assert len(entries) >= 8
    for e in entries.values():
        assert e.who and e.source and e.setup and e.hardware and e.values
        assert e.url is None or e.url.startswith("https://")
        assert "(published)" in e.label()
        for ch in e.chapters:
            nb = CHAPTERS / f"{ch}.ipynb"
            assert nb.exists(), f"{e.key} names a chapter that does not exist: {ch}"
            assert e.key in nb.read_text(), f"{e.key} is listed for {ch}, which does not draw it"
    assert {p.key for p in P.for_chapter("05_speculative_decoding")} >= {"leviathan-2023/T5-XXL"}


def test_gpt_fast_bandwidth_is_its_tokens_per_second_times_the_books_bytes_per_step():
    """gpt-fast's GB/s column is tokens/s x bytes per token: for bf16 that matches the book's count of a step."""
    e = P.get("gpt-fast/Llama-2-7B/bf16")
    per_token = e.values["achieved_bw_gbs"] * 1e9 / e.values["tokens_per_s"]
    step = R.decode_step("Llama-2-7B", 1, 5, "bf16").bytes
    assert abs(per_token / step - 1) < 0.05
    # quantized rows read fewer bytes per token, in the order of their precision
    per = {p: P.get(f"gpt-fast/Llama-2-7B/{p}").values for p in ("bf16", "int8", "int4")}
    b = {p: v["achieved_bw_gbs"] / v["tokens_per_s"] for p, v in per.items()}
    assert b["bf16"] > b["int8"] > b["int4"]
    spec = P.get("gpt-fast/speculative/Llama-2-70B-int4+7B-int4")
    assert spec.baseline in P.load()


def test_get_names_the_keys_there_are():
    with pytest.raises(KeyError, match="gpt-fast/Llama-2-7B/bf16"):
        P.get("gpt-fast/Llama-2-7B/fp64")


def test_caption_says_published_and_fits_the_page():
    text = P.caption(P.for_chapter("01_serial_decoding"))
    assert text.startswith("Published, not measured by the book:")
    assert all(len(line) <= 90 for line in text.splitlines())
    assert "https://github.com/pytorch-labs/gpt-fast" in text


@pytest.mark.parametrize("break_it, msg", [
    (lambda d: d.update(format="other"), "not a published-measurements file"),
    (lambda d: d["entries"][0].pop("source"), "lacks source"),
    (lambda d: d["entries"][0]["values"].update(tokens_per_s=-1), "positive"),
    (lambda d: d["entries"][0]["values"].update(tokens_per_s=float("nan")), "positive"),
    (lambda d: d["entries"][0].update(url="http://example.com"), "https"),
    (lambda d: d["entries"][0].update(who=" "), "empty who"),
    (lambda d: d["entries"].append(copy.deepcopy(d["entries"][0])), "appears twice"),
    (lambda d: d["entries"][1].update(baseline="nope"), "baseline 'nope'"),
    (lambda d: d["entries"][0]["values"].update(speedup_low=3.0, speedup_high=2.0), "above its _high"),
])
def test_a_bad_file_is_refused(tmp_path, break_it, msg):
    d = shipped()
    break_it(d)
    path = tmp_path / "published.json"
    path.write_text(json.dumps(d))
    with pytest.raises(P.PublishedFormatError, match=msg):
        P.load(path)


def test_caption_does_not_print_what_a_source_leaves_unstated():
    text = P.caption([P.get("google-2025/Gemini-Diffusion"), P.get("gpt-fast/Llama-2-7B/bf16")], width=200)
    assert "Gemini Diffusion, hardware not stated;" in text
    assert "(not stated)" not in text and "on not stated" not in text
    assert "Llama-2-7B (bf16), on A100 80GB;" in text


def test_caption_puts_the_precision_inside_a_models_own_parenthesis():
    entry = next(p for p in P.load().values() if p.model.endswith(")") and p.precision != P.NOT_STATED)
    text = P.caption([entry], width=400)
    assert f"{entry.model[:-1]}, {entry.precision})" in text and ") (" not in text
