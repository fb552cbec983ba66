"""Open the built HTML book in headless Chromium: pages load with no network, formulas are typeset, figures render,
static sliders move the figure.

Run after `jupyter-book build` (make test does). Without Chromium it is skipped with a message, except in CI.
Screenshots land in _build/screenshots/.
"""
import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
MAX_PAGE = 1_000_000          # bytes of HTML per chapter page (figures and slider frames are separate files)
PAGES = ["index.html"] + [f"chapters/{p.stem}.html" for p in sorted((ROOT / "chapters").glob("*.ipynb"))]

if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI needs Debian's chromium for the browser check (.ci/run installs it)")
# Each test is skipped, not the module: a module skipped whole collects nothing, and pytest's exit code 5 for that
# would fail `make test` on a machine without Chromium.
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: browser check skipped "
                                                          "(apt-get install chromium to run it)")]


@pytest.fixture(scope="module")
def server():
    assert (HTML / "index.html").exists(), "build the book first: make book"
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def _raw_tex(page) -> list[str]:
    """TeX delimiters still in the page's text outside code, after MathJax (served from _static) has typeset it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    if page.locator(".math").count():
        try:
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=15000)
            page.evaluate("MathJax.startup.promise")
        except PlaywrightTimeout:
            pass                                          # no MathJax: the check below lists the TeX left
    return page.evaluate(r"""() => {
        const main = document.querySelector('main').cloneNode(true);
        main.querySelectorAll('pre, code, script, mjx-assistive-mml').forEach(e => e.remove());
        return main.innerText.split('\n').filter(l => /\\\(|\\\[|\$\$/.test(l)).map(l => l.slice(0, 80));
    }""")


@pytest.mark.parametrize("page_path", PAGES)
def test_page_renders_with_its_figures_and_no_external_scripts(server, browser, page_path):
    assert (HTML / page_path).exists(), f"{page_path} was not built"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    failed = []
    page.on("requestfailed", lambda r: failed.append(r.url) if r.url.startswith(server) else None)
    page.goto(f"{server}/{page_path}", wait_until="load")
    # index.html is a meta-refresh to the first page: wait until the page that has the content has loaded (a check
    # that ran in between once found no <main>)
    page.wait_for_selector("main", state="attached", timeout=30000)
    page.wait_for_load_state("load")
    page.wait_for_timeout(300)
    external = page.eval_on_selector_all(
        "script[src]", "els => els.map(e => e.src).filter(s => !s.startsWith(location.origin))")
    assert not external, f"{page_path} loads scripts from elsewhere: {external}"
    raw = _raw_tex(page)
    assert not raw, f"{page_path}: formulas left as TeX source (MathJax did not typeset them): {raw[:3]}"
    images = page.eval_on_selector_all("main img", "els => els.map(e => [e.currentSrc.slice(0, 60), e.complete "
                                                   "&& e.naturalWidth > 0])")
    assert all(ok for _, ok in images), f"{page_path}: images that did not load: {[s for s, ok in images if not ok]}"
    assert not failed, f"{page_path}: requests that failed: {failed}"
    wide = page.eval_on_selector_all("main pre", "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map("
                                     "e => e.innerText.split('\\n').reduce((a, l) => l.length > a.length ? l : a))")
    assert not wide, f"{page_path}: code wider than the column (shorten these lines): {wide[:3]}"
    # a figure shown narrower than it was drawn has its labels shrunk: cell figures are drawn for the column (or
    # for a full-width cell) at 2x pixels, and the page sets their width to half of that (style width)
    shrunk = page.eval_on_selector_all("main .cell_output img", """els => els.map(e => {
        const drawn = parseFloat(e.style.width) || Number(e.getAttribute('width')) || e.naturalWidth;
        return [e.currentSrc.slice(-40), e.getBoundingClientRect().width / drawn];
    }).filter(([, r]) => r < 0.9).map(([s, r]) => `${s} at ${Math.round(100 * r)}%`)""")
    assert not shrunk, f"{page_path}: figures shrunk to fit the column (unreadable labels): {shrunk[:4]}"
    # a full-width figure spreads into the right margin, where the "Contents" panel sits: the theme folds the panel
    # into a sticky button while such a figure is in view (an IntersectionObserver, a frame after the scroll), so,
    # scrolled near the top of the window and given that frame, the figure's right edge must be the topmost thing
    covered = []
    for img in page.locator("main div.cell.tag_full-width .cell_output img").element_handles():
        img.evaluate("e => { e.scrollIntoView({block: 'start'}); window.scrollBy(0, -120); }")
        page.wait_for_timeout(300)
        covered += [img.evaluate("""e => {
            const r = e.getBoundingClientRect();
            const top = document.elementFromPoint(Math.min(r.right - 20, innerWidth - 1), Math.max(r.top + 30, 80));
            return top === e ? null : `${e.currentSrc.slice(-40)} under ${top && (top.className || top.tagName)}`;
        }""")]
    covered = [c for c in covered if c]
    assert not covered, f"{page_path}: full-width figures hidden by another element: {covered[:3]}"
    if page_path.startswith("chapters/"):
        assert len(images) >= 3, f"{page_path} shows only {len(images)} figures"
        size = (HTML / page_path).stat().st_size
        assert size <= MAX_PAGE, f"{page_path} is {size / 1e6:.2f} MB of HTML; pages stay under {MAX_PAGE / 1e6:.0f} MB"
        colab = page.eval_on_selector_all("a[href*='colab.research.google.com']", "els => els.map(e => e.href)")
        owner_repo = URL.split("github.com/")[1]
        assert colab and all(owner_repo in h for h in colab), f"Colab links point elsewhere: {colab}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / (page_path.replace("/", "_") + ".png")), full_page=False)
    page.close()


@pytest.mark.parametrize("page_path", [p for p in PAGES if p.startswith("chapters/")])
def test_static_slider_changes_the_figure(server, browser, page_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{server}/{page_path}", wait_until="load")
    sliders = page.locator(".book-slider")
    assert sliders.count() >= 1, f"{page_path} has no static slider"
    for i in range(sliders.count()):
        s = sliders.nth(i)
        img, text = s.locator("img"), s.locator("pre")
        before = (img.get_attribute("src"), text.text_content())
        assert before[0].startswith("data:image/png;base64,") and len(before[0]) > 1000   # the start frame inline
        rng = s.locator("input[type=range]").first
        new = 0 if rng.get_attribute("value") != "0" else int(rng.get_attribute("max"))
        rng.evaluate("(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }", new)
        after = (img.get_attribute("src"), text.text_content())
        assert after[0] != before[0], f"{page_path}: slider {i} did not change the figure"
        assert after[1] != before[1], f"{page_path}: slider {i} did not change the printed result"
        # other frames are files in _static/frames, fetched from this server on the first move
        img.evaluate("i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })")
        assert img.evaluate("i => i.naturalWidth") > 0, f"{page_path}: slider {i}'s frame {after[0][:60]} did not load"
        s.scroll_into_view_if_needed()
        s.screenshot(path=str(SHOTS / f"{page_path.replace('/', '_')}.slider{i}.png"))
    page.close()


@pytest.mark.parametrize("page_path", [p for p in PAGES if p.startswith("chapters/")])
def test_page_fits_a_1100_px_window(server, browser, page_path):
    """Between 992 and 1200 px the theme spreads full-width cells with no right-hand panel to spread into: nothing
    may push the page wider than the window (a figure cut at the right edge, a sideways scroll)."""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.goto(f"{server}/{page_path}", wait_until="load")
    page.wait_for_selector("main", state="attached", timeout=30000)
    wide = page.evaluate("""() => [...document.querySelectorAll('main img, main table, main pre')]
        .map(e => [e.tagName + ' ' + (e.currentSrc || e.innerText || '').slice(-40), e.getBoundingClientRect().right])
        .filter(([, r]) => r > innerWidth + 1).map(([s, r]) => `${s} to ${Math.round(r)} px`)""")
    assert not wide, f"{page_path}: past the right edge of an 1100-px window: {wide[:3]}"
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth + 1"), f"{page_path} scrolls sideways"
    page.close()
