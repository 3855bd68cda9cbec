"""The report in a real headless Chromium (Debian's `chromium`, installed by .ci/run): every
figure renders, no JavaScript error, and the static PNG export works. Without a browser this
test fails rather than skips: it is part of what CI checks."""

from __future__ import annotations

import re
import struct
import subprocess

import pytest

from avbench.report import write_report
from avbench.report.page import find_browser

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    # Let plotly's deferred work (fonts, relayout) finish before the DOM is read.
    "--virtual-time-budget=5000",
]


@pytest.fixture
def browser() -> str:
    path = find_browser()
    if path is None:
        pytest.fail("no Chromium: install Debian's chromium (see .ci/run) or set BROWSER_PATH")
    return path


def _chromium(browser: str, profile, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_every_figure_renders_without_js_errors(run_dir, browser, tmp_path):
    files = write_report([run_dir])
    html = files.html.read_text()
    figures = re.findall(r'<div id="(fig-[^"]+)" class="plotly-graph-div"', html)
    assert len(figures) == 7

    url = files.html.resolve().as_uri()
    res = _chromium(browser, tmp_path / "profile", "--enable-logging=stderr", "--v=0",
                    "--dump-dom", url)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    # Chromium logs every console message and uncaught exception of the page as CONSOLE lines.
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    dom = res.stdout
    rendered = []
    for i, fig in enumerate(figures):
        start = dom.index(f'id="{fig}"')
        end = dom.index(f'id="{figures[i + 1]}"') if i + 1 < len(figures) else len(dom)
        if 'class="main-svg"' in dom[start:end]:
            rendered.append(fig)
    assert rendered == figures

    shot = run_dir / "report-screenshot.png"
    res = _chromium(browser, tmp_path / "profile", "--window-size=1400,4000",
                    f"--screenshot={shot}", url)  # fmt: skip
    assert res.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", shot.read_bytes()[16:24])
    assert (width, height) == (1400, 4000)

    assert files.images_skipped is None
    pngs = [p for p in files.images if p.suffix == ".png"]
    svgs = [p for p in files.images if p.suffix == ".svg"]
    assert len(pngs) == len(svgs) == len(figures)
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert all("<svg" in p.read_text()[:500] for p in svgs)
