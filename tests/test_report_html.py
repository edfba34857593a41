"""`perfgate report --html DIR` from a real history: the 2x H200 runs of 2026-11-30 (three leases of
collectives and training, then eight back-to-back collectives runs whose last two had regressions)."""
from __future__ import annotations

import re
from html import escape
from pathlib import Path

import matplotlib.image
import pytest

from perfgate.cli import main
from perfgate.report import trends

ROOT = Path(__file__).resolve().parents[1]
HISTORY = [ROOT / "tests" / "data" / "runs" / "2xH200-NV18"]


def latest_by_area() -> dict:
    latest = {}
    for run in trends.load_history(*HISTORY):
        for area in {r.area for r in run.results}:
            if area not in latest or run.created > latest[area].created:
                latest[area] = run
    return latest


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not any(HISTORY[0].glob("ten-run-check-*.json*")):
        pytest.skip(f"no real history at {HISTORY[0]}")
    out = tmp_path_factory.mktemp("html")
    # -k: plot one test function's families (two PNGs) to keep the test quick; the tables cover everything
    assert main(["report", *map(str, HISTORY), "--html", str(out), "--root", str(ROOT), "-k", "test_send_recv"]) == 0
    return out, (out / "index.html").read_text(encoding="utf-8")


def test_every_gated_metric_of_the_latest_run_is_in_its_area_table(page):
    _, html = page
    tables = html.split("<h2>Latest verdicts</h2>")[1].split("<h2>Change points")[0]
    latest = latest_by_area()
    assert sorted(latest) == ["collectives", "training"]
    for area, run in latest.items():
        section = tables.split(f"2xH200-NV18 / {area}:")[1].split("<h3")[0]
        assert f"commit <code>{run.commit}</code>" in section and run.path.name in section
        have = {tuple(re.findall(r"<td[^>]*>(.*?)</td>", row)[:2]) for row in re.findall(r"<tr class=.*?</tr>", section)}
        gated = [r for r in run.results if r.gated and r.area == area]
        assert len(gated) > 20
        for r in gated:
            assert (escape(r.test_id.split("::", 1)[-1]), escape(r.metric)) in have, (r.test_id, r.metric)


def test_regressions_are_highlighted_and_listed_first(page):
    _, html = page
    latest = latest_by_area()["collectives"]
    regressed = {(r.test_id.split("::", 1)[-1], r.metric) for r in latest.results
                 if r.gated and r.outcome == "regression"}
    assert regressed  # the last run of this history failed on send_recv 16 MiB
    marked = {tuple(re.findall(r"<td[^>]*>(.*?)</td>", row)[:2])
              for row in re.findall(r"<tr class=\"regression\"[^>]*>(.*?)</tr>", html)}
    assert marked == regressed
    assert "tr.regression {" in html  # styled inline
    first_row = re.search(r"<tr class=\"(\w+)\"", html).group(1)
    assert first_row == "regression"
    assert f"{len(regressed)} regression(s) in" in html


def test_change_points_and_plots_are_there_and_nothing_is_fetched(page):
    out, html = page
    assert "test_send_recv[nccl-2gpu-16MiB]" in html.split("<h2>Change points")[1].split("<h2>Trends")[0]
    trends_part = html.split("<h2>Trends</h2>")[1]
    families = re.findall(r"<h4>(.*?)</h4>", trends_part)
    assert families == ["2xH200-NV18: test_send_recv busbw_gbps (GB/s, higher is better)",
                        "2xH200-NV18: test_send_recv time_us (us, lower is better)"]
    panels = re.findall(r'<figure class="panel" data-key="([^"]+)">', trends_part)
    assert len(panels) == trends_part.count('<svg class="plot"') and len(panels) >= 4
    # every point says its run, commit and value on hover; no commit link without a repository URL
    assert re.search(r"<title>2026-11-30 \d\d:\d\d commit [0-9a-f]{7,12}: median [0-9.]+ GB/s \(IQR ", trends_part)
    assert "<a href" not in html
    # nothing that a browser would fetch, and no address at all: style and script are inline
    assert not re.search(r"https?://|\bsrc=|<link|url\(|@import", html), "the page refers to something outside"
    assert list(out.iterdir()) == [out / "index.html"]


def test_a_page_links_commits_to_the_configured_repository_escaped(tmp_path):
    if not any(HISTORY[0].glob("ten-run-check-*.json*")):
        pytest.skip(f"no real history at {HISTORY[0]}")
    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nrepository_url = "https://git.example/o/a&b"\n')
    out = tmp_path / "page"
    assert main(["report", *map(str, HISTORY), "--html", str(out), "--root", str(tmp_path), "-k", "16MiB"]) == 0
    html = (out / "index.html").read_text(encoding="utf-8")
    links = set(re.findall(r'<a href="([^"]+)"', html))
    assert links and all(re.fullmatch(r"https://git\.example/o/a&amp;b/commit/[0-9a-f]{7,40}", u) for u in links)
    assert main(["report", *map(str, HISTORY), "--html", str(out), "--root", str(tmp_path), "-k", "16MiB",
                 "--repo-url", "https://other.example/x"]) == 0  # the option wins over the setting
    assert "https://other.example/x/commit/" in (out / "index.html").read_text(encoding="utf-8")
    for bad in ("javascript:alert(1)", 'https://x.example/"><script>', "https://user:pw@x.example/r"):
        assert main(["report", *map(str, HISTORY), "--html", str(out), "--root", str(tmp_path), "--repo-url", bad]) == 2


def test_a_page_made_with_include_tainted_says_tainted_runs_counted(tmp_path):
    if not any(HISTORY[0].glob("ten-run-check-*.json*")):
        pytest.skip(f"no real history at {HISTORY[0]}")
    out = tmp_path / "page"
    assert main(["report", *map(str, HISTORY), "--html", str(out), "--root", str(ROOT), "-k", "16MiB",
                 "--include-tainted"]) == 0
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "tainted runs counted (--include-tainted)" in html and "tainted runs left out" not in html
