import base64
import json
import re
import subprocess
import sys
import zlib

import pytest
from plotly.offline import get_plotlyjs

from avbench.report import write_report
from avbench.store.run_store import RunStore


def _plots(html: str) -> list[str]:
    return re.findall(r'<div id="(fig-[^"]+)" class="plotly-graph-div"', html)


def test_report_of_one_run(run_dir, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chromium")
    files = write_report([run_dir])
    html, md = files.html.read_text(), files.markdown.read_text()
    assert files.html == run_dir / "report.html" and files.images == []
    assert "no Chromium found" in files.images_skipped and "Static figures skipped" in md
    plots = _plots(html)
    # Pareto per workload + pooled, refits beside gsm8k (its captures), acceptance, 2 latency.
    assert plots == [
        "fig-pareto-tiny-gsm8k", "fig-refits-tiny-gsm8k", "fig-pareto-tiny-humaneval",
        "fig-pareto-tiny-all-workloads", "fig-acceptance-by-position",
        "fig-latency-tiny-gsm8k", "fig-latency-tiny-humaneval",
    ]  # fmt: skip
    # plotly.js inlined once, deflated (the browser inflates it: test_report_browser.py).
    (packed,) = re.findall(r'<script type="application/octet-stream" id="avbench-plotlyjs">'
                           r"([^<]+)</script>", html)  # fmt: skip
    assert html.count("<script src=") == 0
    assert b"plotly.js v" in zlib.decompress(base64.b64decode(packed), -15)[:200]
    # 7 figures over 48 cells in well under half of what plotly.js alone takes uncompressed.
    assert len(html.encode()) < 0.45 * len(get_plotlyjs().encode())
    assert "av-k3 is on the frontier at 2 of 3 loads (c=1, c=4)" in md
    assert "| c=16 | schedule | 1 | 1 |" in md  # static-k1 beats AV at c=16
    assert "vLLM keeps the last range's K for larger batches): `[[1, 8, 3], [9, 16, 1]]`" in md
    assert "| gsm8k | 151.5 → 161.6 | +6.7% | 2.0% |" in md
    assert "ON faster beyond noise" in md
    assert "static-k1__gsm8k__c64__rep0" in md and "finished by resume" not in md
    assert "nan" not in md.lower() and "| — |" in md  # baseline has no acceptance
    # No captures: AV's acceptance is the counters' per scheduled draft, and says so.
    assert "| +0.0 pp (ON per scheduled draft) | — |" in md
    assert "| 0.50 (per scheduled) | 3.00 | 3.00 (per scheduled) | — |" in md


def test_av_acceptance_per_verified_draft_from_captures(tmp_path, run_factory):
    store = run_factory(tmp_path, av_captured=True, repeats=1)
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "| +20.0 pp | 25% |" in md  # gain table: 0.70 per verified vs static's 0.50
    assert "| av-k3 | c=1 |" in md and "| 0.70 | 3.00 | 2.25 | 25% |" in md
    assert "(per scheduled)" not in md and "(ON per scheduled draft)" not in md


def test_av_and_its_twin_on_different_backends_is_a_warning(tmp_path, run_factory):
    same = {"attention_backend_chosen": "FLASH_ATTN", "cudagraph_mode_chosen": "FULL_AND_PIECEWISE"}
    engine = {"static-k3": same, "av-k3": same}
    md = write_report([run_factory(tmp_path / "a", engine=engine, repeats=1).root],
                      static_figures=False).markdown.read_text()  # fmt: skip
    assert "differ beyond AV" not in md
    engine["av-k3"] = same | {"attention_backend_chosen": "FLASHINFER"}
    md = write_report([run_factory(tmp_path / "b", engine=engine, repeats=1).root],
                      static_figures=False).markdown.read_text()  # fmt: skip
    assert (
        "> static-k3 and av-k3 servers differ beyond AV: attention backend chosen FLASH_ATTN vs "
        "FLASHINFER (from their logs)"
    ) in md


def test_cpu_run_says_av_is_unsupported(tmp_path, run_factory):
    store = run_factory(tmp_path, av_unsupported=True, repeats=1)
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "av-k3 (r1) was not measured: av-k3: the CPU build runs Model Runner V1" in md
    assert "No AV gain table for r1" in md
    assert "noise unknown (one repeat)" in md


def test_two_runs_place_the_dyn_arm_and_check_its_schedule(tmp_path, run_factory):
    first = run_factory(tmp_path, "r1", arms=("baseline", "static-k1", "static-k3"), repeats=1)
    second = RunStore.create(tmp_path, "r2", {"run_id": "r2", "pair": {"name": "tiny"},
                                              "sweep": {"schedule": [[1, 2, 3], [3, 16, 1]]}})  # fmt: skip
    for c, per_draft in ((1, 3.0), (4, 1.05), (16, 2.0)):
        second.write_cell(
            {"cell_id": f"dyn-k3__gsm8k__c{c}__rep0", "arm": "dyn-k3", "arm_kind": "dyn", "k": 3,
             "pair": "tiny", "workload": "gsm8k", "concurrency": c, "rate": None, "repeat": 0,
             "output_tok_s_per_gpu": 170.0 * c, "interactivity_tok_s_user": 170.0,
             "num_drafts": 100.0, "num_draft_tokens": 100.0 * per_draft},
            [], {},
        )  # fmt: skip
    files = write_report([first.root, second.root], tmp_path / "out", static_figures=False)
    md = files.markdown.read_text()
    assert "| c=1 | 3 | 3.00 | yes |" in md and "| c=4 | 1 | 1.05 | yes |" in md
    assert "| c=16 | 1 | 2.00 | NO |" in md
    assert "static-k3 (OFF) → dyn-k3 (ON) at c=1" in md
    assert "static-k3 and dyn-k3 come from different runs (sessions)" in md
    assert "dyn-k3 is on the frontier at" in md
    assert "fig-pareto-tiny-gsm8k" in files.html.read_text()


@pytest.mark.slow
def test_cli_report_and_recommend(run_dir):
    cli = [sys.executable, "-m", "avbench.cli"]
    res = subprocess.run([*cli, "report", str(run_dir), "--no-figures"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"report: {run_dir / 'report.html'}" in res.stdout
    res = subprocess.run([*cli, "recommend", str(run_dir)], capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "c=1–4: **AV**" in res.stdout and "c=16: **schedule (K 1)**" in res.stdout
    res = subprocess.run([*cli, "recommend", str(run_dir), "--json"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    (answer,) = json.loads(res.stdout)
    assert answer["schedule"] == [[1, 8, 3], [9, 16, 1]]
    assert answer["deploy"]["the schedule"]["num_speculative_tokens_per_batch_size"] == [
        [1, 8, 3], [9, 16, 1],
    ]  # fmt: skip


@pytest.mark.parametrize("bad", ["nowhere"])
def test_not_a_run_directory_is_one_line(tmp_path, bad):
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "recommend", str(tmp_path / bad)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (
        res.returncode == 2 and res.stderr.count("\n") == 1 and "not a run directory" in res.stderr
    )


def test_open_loop_runs_report_alone_merged_and_beside_closed_loop(tmp_path, run_factory):
    """Rates-only, mixed and merged runs each draw every load they measured (open-loop points
    as their own markers, one latency box per rate)."""
    from avbench.store.merge import merge_runs
    from avbench.testing.report_page import figures_of, trace_labels

    rates = run_factory(tmp_path, "rates", concurrencies=(), rates=(2.0, 8.0), repeats=1)
    closed = run_factory(tmp_path, "closed", concurrencies=(1, 4), repeats=1)
    merged = merge_runs([rates.root, closed.root], tmp_path / "merged").store.root
    cases = {
        (rates.root,): {"r=2/s", "r=8/s"},
        (rates.root, closed.root): {"r=2/s", "r=8/s", "c=1", "c=4"},
        (merged,): {"r=2/s", "r=8/s", "c=1", "c=4"},
    }
    for i, (runs, loads) in enumerate(cases.items()):
        files = write_report(list(runs), tmp_path / f"out{i}", static_figures=False)
        figs = figures_of(files.html.read_text())
        pareto = trace_labels(figs["fig-pareto-tiny-gsm8k"])
        assert loads <= set(pareto), (runs, pareto)
        boxes = set(trace_labels(figs["fig-latency-tiny-gsm8k"]))
        assert {f"av-k3 {load}" for load in loads} <= boxes, boxes
        assert {f"| gsm8k | av-k3 | {load} |" for load in loads} <= set(
            re.findall(r"\| gsm8k \| av-k3 \| [^|]+ \|", files.markdown.read_text())
        )


def test_a_cell_stored_with_no_output_token_is_flagged_and_never_wins(tmp_path, run_factory):
    # As a dead engine behind a live API server left cells before avbench checked its health:
    # stored as measured, 32 "successful" requests, no token, a throughput from the window.
    store = run_factory(tmp_path, arms=("baseline", "static-k3"), concurrencies=(1, 4), repeats=1)
    void = {"cell_id": "static-k1__gsm8k__c4__rep0", "arm": "static-k1", "arm_kind": "static",
            "k": 1, "pair": "tiny", "workload": "gsm8k", "concurrency": 4, "repeat": 0,
            "output_tok_s_per_gpu": 1e6, "interactivity_tok_s_user": 1e5, "output_tokens": 0,
            "requests_ok": 32, "requests_failed": 0}  # fmt: skip
    store.write_cell(void, [], {})
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "> 1 cell(s) stored as measured hold no output token" in md
    assert "r1/static-k1__gsm8k__c4__rep0" in md and "| static-k1 |" not in md
    res = subprocess.run([sys.executable, "-m", "avbench.cli", "recommend", str(store.root),
                          "--json"], capture_output=True, text=True, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "warning: 1 cell(s) stored as measured hold no output token" in res.stderr
    (answer,) = json.loads(res.stdout)
    assert [d["best_static"]["label"] for d in answer["decisions"]] == ["static-k3"] * 2
