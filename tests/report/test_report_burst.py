"""Burst-delivered points (stream_burst_frac above BURST_SUSPECT_FRAC) on the page: crossed and
faded in the Pareto figure with the reason in the hover, a warning beside it, and the points
table and the recommendation saying so."""

import pandas as pd

from avbench.analysis.points import BURST_SUSPECT_FRAC, build_points
from avbench.report import figures as figs
from avbench.report import write_report


def _cells(burst: dict[tuple[str, int], float]) -> pd.DataFrame:
    rows = []
    for arm, k, y in (("baseline", 0, 100.0), ("static-k3", 3, 150.0)):
        for c in (1, 4):
            rows.append(
                {
                    "cell_id": f"{arm}__w__c{c}__rep0", "pair": "p", "arm": arm,
                    "arm_kind": arm.split("-")[0], "k": k, "workload": "w",
                    "concurrency": c, "rate": None, "repeat": 0,
                    "output_tok_s_per_gpu": y * c, "interactivity_tok_s_user": y,
                    "tpot_ms_median": 1000 / y, "stream_burst_frac": burst.get((arm, c), 0.0),
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def _markers(fig) -> dict[str, tuple[str, float, str]]:
    """'arm load' -> (symbol, opacity, hover extra) of every point drawn."""
    out = {}
    for tr in fig.data:
        if tr.customdata is None:
            continue
        for i, label in enumerate(tr.text):
            key = f"{tr.name} {label.split()[0]}"
            out[key] = (tr.marker.symbol[i], tr.marker.opacity[i], tr.customdata[i][2])
    return out


def test_pareto_marks_the_burst_delivered_point_with_its_reason():
    # At the threshold exactly a point is not suspect; just above it, it is.
    points = build_points(_cells({("baseline", 4): 0.31, ("static-k3", 1): BURST_SUSPECT_FRAC}))
    fig = figs.pareto(points[points["workload"] == "w"], "t", figs.arm_colors(["baseline"]))
    marks = _markers(fig)
    symbol, opacity, hover = marks["baseline c=4"]
    assert symbol == "circle-x" and opacity < 1
    assert "burst-delivered: 31% of a cell's streams arrived in one burst" in hover
    for clean in ("baseline c=1", "static-k3 c=1", "static-k3 c=4"):
        assert marks[clean] == ("circle", 1.0, ""), clean
    labels = [t for tr in fig.data if tr.text is not None for t in tr.text]
    assert "c=4 ⚠" in labels and "c=1 ⚠" not in labels


def test_page_and_recommendation_flag_a_burst_delivered_arm(tmp_path, run_factory):
    burst = {"static-k3": {"stream_burst_frac": 0.31}}  # every static-k3 cell
    store = run_factory(tmp_path, engine=burst, repeats=1, workloads=("gsm8k",))
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "> Burst-delivered points (crossed, faded, ⚠): static-k3 c=1 (31%), static-k3 c=4" in md
    assert "| 1 | 31% ⚠ suspect |" in md and "| static-k1 | c=1 |" in md
    assert "⚠ suspect" not in next(
        line for line in md.splitlines() if "| static-k1 | c=1 |" in line
    )
    # AV beats static-k3 at c=1 and 4 on throughput, which stands; the verdict says so.
    assert "| c=1 | AV |" in md
    assert "burst-delivered streams (static-k3 31% in one burst): throughput stands" in md
    assert "caveat: static-k3 at c=1, static-k3 at c=4 burst-delivered" in md
    # At c=16 static-k1 wins over av-k3: neither burst-delivered, no caveat there.
    c16 = next(line for line in md.splitlines() if line.startswith("| c=16 |"))
    assert "burst" not in c16
