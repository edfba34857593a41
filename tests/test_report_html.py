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
              for row in re.findall(r"<tr class=\"regression\">(.*?)</tr>", html)}
    assert marked == regressed
    assert "tr.regression {" in html  # styled inline
    first_row = re.search(r"<tr class=\"(\w+)\">", html).group(1)
    assert first_row == "regression"
    assert f"{len(regressed)} regression(s) in" in html


def test_change_points_and_plots_are_there_and_nothing_is_fetched(page):
    out, html = page
    assert "test_send_recv[nccl-2gpu-16MiB]" in html.split("<h2>Change points")[1].split("<h2>Trends")[0]
    images = re.findall(r"<img src=\"([^\"]+)\"", html)
    assert sorted(images) == ["2xH200-NV18__test_send_recv_busbw_gbps.png", "2xH200-NV18__test_send_recv_time_us.png"]
    for name in images:
        assert matplotlib.image.imread(out / name).shape[1] > 400
    assert not re.search(r"https?://|<script|<link", html)
