"""A real headless browser for tests of HTML the package writes: Debian's ``chromium`` driven through its
``chromedriver`` by selenium (the ``browser`` extra). Where one of the three is missing, the test that asks for
it is skipped with the reason (``.ci/run`` installs the browser with apt-get; elsewhere it may be absent).

    from tests.browser import headless_chromium

    with headless_chromium(width=1400, height=900) as driver:
        driver.get(path.as_uri())
        driver.execute_script("return document.title")

The README's picture of a report is taken with the same browser (``python -m tests.browser PAGE PNG``, see
:func:`screenshot`).

Chromium starts with a fresh profile and its background services off: on a machine without internet its
component updater, sync and first-run requests otherwise stall or fail the start."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
"""Browser binaries looked for on PATH (Debian's is ``chromium``), unless ``EDITSCOPE_CHROMIUM`` names one."""
CHROMEDRIVER = ("chromedriver",)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run")


def _find(env: str, names: tuple[str, ...]) -> str | None:
    if os.environ.get(env):
        return os.environ[env] if Path(os.environ[env]).is_file() else None
    return next((p for p in map(shutil.which, names) if p), None)


def missing() -> str | None:
    """Why no browser can be driven here (None when selenium, chromium and chromedriver are all present)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[browser]')"
    if _find("EDITSCOPE_CHROMIUM", CHROMIUM) is None:
        return "no chromium on PATH (apt-get install chromium chromium-driver; or set EDITSCOPE_CHROMIUM)"
    if _find("EDITSCOPE_CHROMEDRIVER", CHROMEDRIVER) is None:
        return "no chromedriver on PATH (apt-get install chromium-driver; or set EDITSCOPE_CHROMEDRIVER)"
    return None


@contextmanager
def headless_chromium(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A selenium WebDriver of a headless Chromium whose viewport is ``width`` × ``height`` CSS pixels, quit and
    its profile deleted on exit; skips the calling test when the browser or its driver is missing."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="editscope-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = _find("EDITSCOPE_CHROMIUM", CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    service = Service(executable_path=_find("EDITSCOPE_CHROMEDRIVER", CHROMEDRIVER))
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except Exception as exc:  # a browser that is there but will not start: skip, saying why
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"chromium did not start: {str(exc).splitlines()[0]}")
    try:
        # --window-size sets the outer window; make the layout viewport exactly width × height
        inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        if inner != [width, height]:
            size = driver.get_window_size()
            driver.set_window_size(size["width"] + width - inner[0], size["height"] + height - inner[1])
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 900) -> Path:
    """The first ``width`` × ``height`` CSS pixels of the HTML ``page`` as a reader's browser shows them, saved as the
    PNG ``png`` (its folder made)."""
    png.parent.mkdir(parents=True, exist_ok=True)
    with headless_chromium(width=width, height=height) as driver:
        driver.get(page.resolve().as_uri())
        if not driver.save_screenshot(str(png)):
            raise RuntimeError(f"chromium wrote no screenshot of {page}")
    return png


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.browser", description="Screenshot an HTML page (the "
                                     "README's report picture: python -m tests.browser runs/demo/report.html "
                                     "docs/img/report.png) in headless Chromium.")
    parser.add_argument("page", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    if missing() is not None:
        parser.error(str(missing()))
    if not args.page.is_file():
        parser.error(f"{args.page}: no such page")
    print(screenshot(args.page, args.png, args.width, args.height))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
