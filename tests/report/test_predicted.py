"""Predicted cells in the report and the recommendation: gaps filled, never mixed, said so."""

from __future__ import annotations

import json

import pytest

from avbench.analysis.points import build_points
from avbench.report import write_report
from avbench.report.answer import answers
from avbench.report.figures import arm_colors, pareto
from avbench.report.runs import load_runs


def _predict(store, arm: str, gain: float) -> None:
    """Rows as `avbench predict` writes them: one per measured static-k3 cell."""
    rows = []
    for r in store.finished_cells().values():
        if r["arm"] != "static-k3":
            continue
        y = r["output_tok_s_per_gpu"] * gain
        rows.append(
            {k: r[k] for k in ("workload", "concurrency", "rate", "repeat", "pair", "k")}
            | {
                "cell_id": r["cell_id"].replace("static-k3", arm), "arm": arm, "arm_kind": "av",
                "predicted": True, "predicted_from": r["cell_id"], "predicted_from_run": "r1",
                "predictor": "avbench-predict 1", "output_tok_s_per_gpu": y,
                "interactivity_tok_s_user": y / r["concurrency"],
                "tpot_ms_median": 1000 * r["concurrency"] / y, "acceptance_length": 2.0,
                "output_tok_s_per_gpu_ci95": 0.04 * y,
            }
        )  # fmt: skip
    (store.root / "predicted.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))


def test_predicted_av_fills_the_unmeasured_arm_and_the_verdict_says_so(run_factory, tmp_path):
    store = run_factory(tmp_path, av_unsupported=True)
    _predict(store, "av-k3", gain=1.2)  # predicted AV beats static-k3 (and static-k1 at c<16)
    runs = load_runs([store.root])
    cells = runs.with_predictions()
    assert (cells.loc[cells["arm"] == "av-k3", "predicted"] == True).all()  # noqa: E712
    assert not runs.cells["arm"].eq("av-k3").any()  # measured cells stay measured only
    (ans,) = answers(runs)
    av_wins = [d for d in ans.pooled.decisions if d.verdict == "AV"]
    assert av_wins and all("rests on predicted av-k3" in " ".join(d.notes) for d in av_wins)
    files = write_report([store.root], static_figures=False)
    md = files.markdown.read_text()
    assert "av-k3 (predicted)" in md and "rests on predicted av-k3" in md
    assert "the table below is predicted" in md  # the AV gain table is a predicted one
    assert "circle-open" in files.html.read_text()  # hollow markers
    # ... with their 95% interval as error bars (4% of each point, as predicted)
    view = build_points(cells)
    pooled = view[view["workload"] == "all workloads"]
    fig = pareto(pooled, "t", arm_colors(list(pooled["arm"].unique())))
    (trace,) = [t for t in fig.data if t.name == "av-k3 (predicted)"]
    assert list(trace.error_y.array) == pytest.approx([0.04 * y for y in trace.y])


def test_a_measured_arm_wins_over_its_prediction(run_factory, tmp_path):
    store = run_factory(tmp_path)  # av-k3 measured at every load
    _predict(store, "av-k3", gain=5.0)
    runs = load_runs([store.root])
    cells = runs.with_predictions()
    assert len(cells) == len(runs.cells)  # nothing predicted is added where av-k3 was measured
    (ans,) = answers(runs)
    assert not any("rests on predicted" in " ".join(d.notes) for d in ans.pooled.decisions)
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "Predicted vs measured" in md and "av-k3 (predicted)" not in md


def test_an_adaptive_run_shows_each_verdict_with_what_it_rests_on(run_factory, tmp_path):
    store = run_factory(tmp_path)
    standings = [
        {"concurrency": 1, "verdict": "static K=1", "winner": "static-k1", "state": "decided",
         "margin": 0.31, "contenders": [], "rests_on_prediction": False},
        {"concurrency": 4, "verdict": "no speculation", "winner": "baseline",
         "state": "inside noise", "margin": 0.02, "contenders": ["static-k1"],
         "rests_on_prediction": True},
    ]  # fmt: skip
    state = {"policy": {}, "sweep": {"name": "s"},
             "rounds": [{"round": 0, "cells": ["a", "b"], "seconds": 50.0},
                        {"round": 1, "standings": standings}],
             "status": "inside noise", "server_seconds": 50.0}  # fmt: skip
    (store.root / "adaptive.json").write_text(json.dumps(state))
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "Status inside noise: 2 cells measured in 1 round(s), 50 server-seconds" in md
    assert "| c=1 | static K=1 | decided | +31.0% | - | measurements |" in md
    assert "| c=4 | no speculation | inside noise | +2.0% | static-k1 | a prediction |" in md
    (store.root / "adaptive.json").write_text('{"rounds": [')  # torn: said, not a traceback
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "adaptive.json: not an adaptive state file (not JSON" in md
    assert "| c=1 | static K=1" not in md
    # Read through the store's typed AdaptiveRecord: a field of the wrong type is named in
    # one line (read by hand, the page raised formatting "x" as a percentage).
    standings[0]["margin"] = "x"
    (store.root / "adaptive.json").write_text(json.dumps(state))
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "not an adaptive state file (rounds.1.standings.0.margin: " in md


def test_a_completed_adaptive_run_shows_each_verdict_with_every_cell_measured(
    run_factory, tmp_path
):
    store = run_factory(tmp_path)
    rounds = [{"concurrency": c, "verdict": "static K=1", "state": "decided"} for c in (1, 4)]
    full = [{"concurrency": 1, "verdict": "static K=1", "state": "decided"},
            {"concurrency": 4, "verdict": "no speculation", "state": "inside noise"}]  # fmt: skip
    state = {"policy": {}, "sweep": {"name": "s"}, "status": "decided", "server_seconds": 50.0,
             "rounds": [{"round": 0, "cells": ["a", "b"], "seconds": 50.0},
                        {"round": 1, "standings": rounds}],
             "completion": {"cells": ["c", "d", "e"], "seconds": 70.0, "standings": full}}  # fmt: skip
    (store.root / "adaptive.json").write_text(json.dumps(state))
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "Completed (--complete): 3 more cells, 70 server-seconds" in md
    assert "| c=1 | static K=1 | decided | - | - | measurements | static K=1 (decided) |" in md
    assert (
        "| c=4 | static K=1 | decided | - | - | measurements | no speculation (inside noise) |"
        in md
    )


def test_predicted_rows_without_a_pair_belong_to_their_runs_pair(run_factory, tmp_path):
    store = run_factory(tmp_path, av_unsupported=True)
    _predict(store, "av-k3", gain=1.2)
    path = store.root / "predicted.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "pair"}) + "\n" for r in rows)
    )
    runs = load_runs([store.root])
    (ans,) = answers(runs)  # written before predicted rows named their pair
    assert any(d.verdict == "AV" for d in ans.pooled.decisions)
    assert set(runs.with_predictions()["pair"]) == {rows[0]["pair"]}
