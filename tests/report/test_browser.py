"""The HTML report as a reader sees it: rendered by a real headless Chromium (tests/browser.py) at 1,400 px, no
table scrolls horizontally and every figure loaded and names its axes. Skipped, with the reason, where selenium,
chromium or chromedriver is missing (.ci/run installs them)."""

from __future__ import annotations

import json

import pytest

from tests.browser import headless_chromium, missing

# skip before the fixture builds a run for nothing
pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

WIDTH = 1400

OVERFLOWING = """return Array.from(document.querySelectorAll('table')).map(t => {
  const box = t.parentElement;
  return {cls: t.className, table: Math.ceil(t.getBoundingClientRect().width), scroll: t.scrollWidth,
          box: box.clientWidth, box_scroll: box.scrollWidth};
}).filter(t => t.scroll > t.box || t.table > t.box || t.box_scroll > t.box);"""

FIGURES = """return Array.from(document.querySelectorAll('img, svg')).map(f => f.tagName.toLowerCase() === 'img'
  ? {tag: 'img', loaded: f.complete && f.naturalWidth > 0, width: f.naturalWidth, alt: f.alt,
     axes: f.getAttribute('data-axes')}
  : {tag: 'svg', loaded: f.getBoundingClientRect().width > 0, width: f.getBoundingClientRect().width,
     alt: f.textContent, axes: null});"""


def test_report_fits_1400px_and_every_figure_names_its_axes(two_method_run):
    _, report = two_method_run
    with headless_chromium(width=WIDTH, height=900) as driver:
        driver.get((report / "report.html").as_uri())
        assert driver.execute_script("return window.innerWidth") == WIDTH
        n_tables = driver.execute_script("return document.querySelectorAll('table').length")
        assert n_tables >= 8  # run meta, 2 pivot parts, 3 compact + their 'All metrics' tables
        assert driver.execute_script(OVERFLOWING) == []
        page = driver.execute_script("return [document.documentElement.scrollWidth, "
                                     "document.documentElement.clientWidth]")
        assert page[0] <= page[1], f"the page itself scrolls sideways: {page}"
        figures = driver.execute_script(FIGURES)
        assert len(figures) == 5
        for f in figures:
            assert f["loaded"] and f["width"] > 0, f["alt"]
            if f["tag"] == "svg":
                continue
            axes = json.loads(f["axes"])
            assert axes, f["alt"]
            for panel in axes:  # matplotlib PNGs: the labels from the figure's own metadata
                assert panel["y"] and (panel["x"] or panel["xticks"] or panel["colorbar"]), (f["alt"], panel)
                assert panel["y"] in f["alt"] or panel["colorbar"]
        # the check can fail: a table wider than the page, added in the browser, is reported
        driver.execute_script("const d = document.createElement('div'); d.className = 'wrap'; d.innerHTML = "
                              "'<table class=\"probe\"><tr>' + '<td>0.123 ± 0.045</td>'.repeat(40) + '</tr></table>';"
                              "document.body.appendChild(d);")
        assert [t["cls"] for t in driver.execute_script(OVERFLOWING)] == ["probe"]


def test_the_readme_screenshot_is_the_page_as_chromium_draws_it(two_method_run, tmp_path):
    """``python -m tests.browser PAGE PNG`` (the README's report picture): the PNG is the viewport, pixel for pixel
    what the page paints (a page painted one colour gives that colour everywhere), and a report gives a picture
    with text and tables in it."""
    from PIL import Image

    from tests.browser import _main, screenshot

    red = tmp_path / "red.html"
    red.write_text("<html><body style='margin:0;background:#c81e1e'></body></html>")
    png = screenshot(red, tmp_path / "shots" / "red.png", width=320, height=200)
    with Image.open(png) as im:
        assert im.size == (320, 200)
        assert set(im.convert("RGB").getdata()) == {(200, 30, 30)}
    _, report = two_method_run
    assert _main([str(report / "report.html"), str(tmp_path / "report.png")]) == 0
    with Image.open(tmp_path / "report.png") as im:
        assert im.size == (WIDTH, 900)
        assert len(set(im.convert("L").getdata())) > 16  # text and rules, not a blank page
    with pytest.raises(SystemExit):
        _main([str(tmp_path / "none.html"), str(tmp_path / "none.png")])
