import numpy as np

from avbench.report import pareto_mask, write_report
from avbench.store import RunStore


def test_pareto_mask_matches_brute_force():
    rng = np.random.default_rng(0)
    x, y = rng.random(200), rng.random(200)
    mask = pareto_mask(x, y)
    for i in range(200):
        dominated = any(
            x[j] >= x[i] and y[j] >= y[i] and (x[j] > x[i] or y[j] > y[i]) for j in range(200)
        )
        assert mask[i] == (not dominated)


def test_report_has_one_trace_per_arm(tmp_path):
    store = RunStore.create(
        tmp_path, "r", {"run_id": "r", "pair": {"name": "p"}, "sweep": {"name": "s"}}
    )
    for arm, scale in (("baseline", 1.0), ("static-k3", 1.5)):
        for c in (1, 4):
            store.write_cell(
                {
                    "cell_id": f"{arm}-{c}",
                    "arm": arm,
                    "workload": "gsm8k",
                    "concurrency": c,
                    "rate": None,
                    "repeat": 0,
                    "output_tok_s_per_gpu": 100 * c * scale,
                    "interactivity_tok_s_user": 50 / c * scale,
                    "acceptance_length": None,
                },
                [],
                {},
            )
    store.write_failure({"cell_id": "av-k3__x", "reason": "unsupported: CPU build <V1>"})
    html = write_report(store).read_text()
    assert html.count('"name":"baseline"') == 1 and html.count('"name":"static-k3"') == 1
    assert "c=4" in html and "unsupported: CPU build &lt;V1&gt;" in html
