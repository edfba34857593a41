"""`perfgate report --store URL --html DIR` over several machines, opened in a real headless Chromium
(tests/browser.py) from a real PostgreSQL store (tests/postgres_server.py; the embedded SQLite default where
no server can be started): the page renders, every plot is
there and drawn, nothing is fetched from the network (the browser's proxy leads nowhere and every request is
seen), the machine selector and the filter work, titles are not clipped, a single panel spans the page, a
ratio's tolerance band stops at zero, hover titles and commit links are there, a hostile test id is text and
the store's password is nowhere on the page.

Skips, naming what to install, where no Chromium is installed (docs/results-store.md says why CI does not
install one). One browser, one page: ~6 s here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfgate.cli import main

sys.path.insert(0, str(Path(__file__).parent))
import browser  # noqa: E402
import postgres_server  # noqa: E402
from test_store_backends import postgres  # noqa: E402,F401 (fixture)

MACHINES = ["cpu-test-2c", "cpu-other-4c", "1xH100-80GB-HBM3"]
HOSTILE = 'perf/x/test_h.py::test_h[<img src="http://evil.example/x" onerror="document.title=1">]'
REPO = "https://git.example/o/r"


def result(test_id: str, metric: str, median: float, *, unit: str = "GB/s", better: str = "higher", tol: float = 0.05,
           tainted: bool = False, outcome: str = "pass", baseline: float | None = None) -> dict:
    samples = [median * f for f in (0.98, 0.99, 1.0, 1.01, 1.02)]
    return {"test_id": test_id, "area": "collectives", "metric": metric, "unit": unit, "better": better, "tol": tol,
            "gated": True, "summary": {"median": median, "mad": median * 0.01, "iqr": median * 0.02, "n": 5,
                                       "samples": samples},
            "verdict": {"outcome": outcome}, "tainted": ["load 2.5 on 2 cores"] if tainted else [],
            "baseline": None if baseline is None else {"median": baseline, "provenance": "measured"}}


def run_doc(hw: str, i: int) -> dict:
    slow = hw == MACHINES[0] and i >= 6  # a step on one machine: a change point, regression verdicts
    results = [result(f"perf/collectives/test_c.py::test_all_reduce[gloo-{size}]", "busbw_gbps",
                      (5.0 if slow else 10.0) * (1 + 0.004 * ((i * 7 + k) % 5)),
                      outcome="regression" if slow else "pass", tainted=(i == 3))
               for k, size in enumerate(("1KiB", "1MiB", "64MiB"))]
    # one test of its family: one panel; a ratio whose band (1.07 +- 150 %) would reach below zero
    results.append(result("perf/collectives/test_c.py::test_ratio_vs_p2p[gloo]", "time_over_p2p",
                          1.07 + 0.01 * (i % 3), unit="x", better="lower", tol=1.5, baseline=1.07))
    results.append(result(HOSTILE, "busbw_gbps", 3.0))
    return {"schema_version": 1, "kind": "perfgate-results", "created": f"2026-12-0{1 + i // 5}T0{i % 5}:1{i}:00+00:00",
            "hardware_id": hw, "commit": f"{i:x}{'ab' * 6}"[:12], "fingerprint": {}, "interrupted": False,
            "results": results}


@pytest.fixture(scope="module")
def store_url(request, tmp_path_factory) -> str:
    """A real PostgreSQL server's database (a fleet's store, with a password in its URL) where the server
    binaries are installed, else the embedded default's SQLite file: the page is made the same way."""
    if postgres_server.binaries() is None:
        return str(tmp_path_factory.mktemp("store") / "runs.sqlite")
    return request.getfixturevalue("postgres").new_database("browser")


@pytest.fixture(scope="module")
def page(store_url, tmp_path_factory):
    if browser.executable() is None:
        pytest.skip(f"no Chromium to open the page in: {browser.INSTALL}")
    tmp = tmp_path_factory.mktemp("page")
    files = []
    for hw in MACHINES:
        for i in range(8):
            path = tmp / f"{hw}-{i}.json"
            path.write_text(json.dumps(run_doc(hw, i), indent=1))
            files.append(str(path))
    url = store_url
    assert main(["store", "add", "--store", url, *files]) == 0
    out = tmp / "html"
    assert main(["report", "--store", url, "--html", str(out), "--root", str(tmp), "--repo-url", REPO]) == 0
    chromium = browser.Browser()
    try:
        requests = chromium.open((out / "index.html").as_uri())
        yield chromium, requests, out
    finally:
        chromium.close()


def js(chromium: browser.Browser, body: str):
    return chromium.evaluate(f"(() => {{ {body} }})()")


def test_the_page_renders_every_plot_and_fetches_nothing(page):
    chromium, requests, out = page
    assert requests == [(out / "index.html").as_uri()], requests   # the page itself, nothing else
    assert list(out.iterdir()) == [out / "index.html"]
    drawn = js(chromium, """return [...document.querySelectorAll('svg.plot')].map(s => {
        const r = s.getBoundingClientRect();
        return [s.closest('section').dataset.hw, r.width, r.height, s.querySelectorAll('circle').length]; });""")
    assert sorted({hw for hw, *_ in drawn}) == sorted(MACHINES)
    assert len(drawn) == 5 * len(MACHINES)                        # 5 series per machine, one panel each
    assert all(w > 300 and h > 100 and circles == 8 for _, w, h, circles in drawn), drawn
    found = js(chromium, "return [...document.querySelectorAll('[href], [src], [*|href]')]"
                      ".map(e => e.getAttribute('href') || e.getAttribute('src') || e.getAttribute('xlink:href'));")
    assert found and all(u.startswith(f"{REPO}/commit/") for u in found), found
    assert js(chromium, "return document.querySelectorAll('img, iframe, object, embed').length;") == 0
    text = js(chromium, "return document.documentElement.outerHTML;")
    assert "admin-secret" not in text   # the store is named without its password
    assert HOSTILE.split("::")[1] in js(chromium, "return document.body.innerText;")  # the id as text
    assert js(chromium, "return document.title;").startswith("perfgate: results store ")


def test_a_machine_is_chosen_and_rows_and_plots_are_filtered(page):
    chromium, _, out = page
    options = js(chromium, "return [...document.querySelectorAll('#machine option')].map(o => o.value);")
    assert options == ["", *sorted(MACHINES)]
    shown = js(chromium, """const s = document.getElementById('machine'); s.value = 'cpu-other-4c';
        s.dispatchEvent(new Event('change'));
        return [...document.querySelectorAll('[data-hw]')].filter(e => e.offsetParent !== null)
               .map(e => e.dataset.hw);""")
    assert shown and set(shown) == {"cpu-other-4c"}
    panels = js(chromium, """const f = document.getElementById('filter'); f.value = 'RATIO';
        f.dispatchEvent(new Event('input'));
        return [...document.querySelectorAll('figure.panel')].filter(e => e.offsetParent !== null)
               .map(e => e.dataset.key);""")
    assert panels == ["perf/collectives/test_c.py::test_ratio_vs_p2p[gloo] time_over_p2p"]
    rows = js(chromium, """return [...document.querySelectorAll('tr[data-key]')].filter(e => e.offsetParent !== null)
               .map(e => e.dataset.key);""")
    assert rows and all("ratio" in r for r in rows)
    # an address with #machine=ID opens on that machine
    chromium.open((out / "index.html").as_uri() + "#machine=1xH100-80GB-HBM3")
    assert js(chromium, "return document.getElementById('machine').value;") == "1xH100-80GB-HBM3"


def test_titles_fit_a_single_panel_spans_the_page_and_a_ratio_band_stops_at_zero(page):
    chromium, _, out = page
    chromium.open((out / "index.html").as_uri())
    clipped = js(chromium, """return [...document.querySelectorAll('h1, h3, h4, figcaption')]
        .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent);""")
    assert clipped == []
    outside = js(chromium, """return [...document.querySelectorAll('svg.plot text')].filter(t => {
        const b = t.getBBox(), v = t.ownerSVGElement.viewBox.baseVal;
        return t.getAttribute('transform') === null && (b.x < -0.5 || b.x + b.width > v.width + 0.5); })
        .map(t => t.textContent);""")
    assert outside == []
    widths = js(chromium, """const f = [...document.querySelectorAll('.family')].find(x => x.querySelectorAll('figure').length === 1);
        return [f.querySelector('figure').getBoundingClientRect().width, f.getBoundingClientRect().width];""")
    assert widths[0] >= 0.95 * widths[1], widths
    # the band of 1.07 +- 150 %: drawn from the zero line up, never below it (no run of the ratio is there)
    bands = js(chromium, """return [...document.querySelectorAll('figure.panel')].filter(f => f.dataset.key.includes('ratio'))
        .map(f => { const zero = [...f.querySelectorAll('.ytick')].find(t => t.textContent === '0'),
                          band = f.querySelector('rect.band').getBBox();
                    return [zero ? zero.getBBox().y + zero.getBBox().height / 2 : null, band.y + band.height,
                            [...f.querySelectorAll('.ytick')].map(t => t.textContent)]; });""")
    assert len(bands) == len(MACHINES)
    for zero_y, band_bottom, ticks in bands:
        assert zero_y is not None and band_bottom <= zero_y + 1 and not any(t.startswith("-") for t in ticks), bands
    hover = js(chromium, "return [...document.querySelectorAll('g.point > title')].map(t => t.textContent);")
    assert len(hover) == 5 * 8 * len(MACHINES) and all(" commit " in h and "median" in h for h in hover)
    assert any("tainted" in h for h in hover) and any("regression" in h for h in hover)
