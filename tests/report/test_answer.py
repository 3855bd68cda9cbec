import pytest

from avbench.errors import AvbenchError
from avbench.report.answer import answers, dyn_settings_from
from avbench.report.runs import load_runs


def test_dyn_settings_carry_the_schedule_and_the_runs_drafting(run_factory, tmp_path):
    store = run_factory(tmp_path)
    store.update_manifest(sweep=store.read_manifest().sweep | {"arms": ["static", "av"]})
    settings = dyn_settings_from(load_runs([store.root]), "tiny")
    assert settings == {
        "schedule": [(1, 8, 3), (9, 16, 1)],
        "draft_sample_method": "probabilistic",  # the run had an AV arm
        "attention_backend": None,
    }


def test_nothing_to_deploy_when_no_speculation_wins_everywhere(run_factory, tmp_path):
    store = run_factory(tmp_path, arms=("baseline", "static-k1"), repeats=1)
    rows = store.finished_cells()
    # Rewrite history: the baseline now beats static-k1 at every load.
    store.cells_path.write_text("")
    for r in rows.values():
        if r["arm"] == "baseline":
            r["output_tok_s_per_gpu"] *= 10
        store.write_cell(r, [], {})
    runs = load_runs([store.root])
    (ans,) = answers(runs)
    assert ans.pooled.deploy_schedule is None and ans.deploy == {}
    assert ans.pooled.schedule == [(1, 16, 1)]  # a dyn arm can still measure the best static K
    assert {d.verdict for d in ans.pooled.decisions} == {"no speculation"}
    assert dyn_settings_from(runs, "tiny")["schedule"] == [(1, 16, 1)]
    with pytest.raises(AvbenchError, match="no measured cell of pair other"):
        dyn_settings_from(runs, "other")
