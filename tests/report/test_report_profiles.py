"""Runs of one pair at different sampling are reported side by side, never averaged."""

from avbench.report import write_report
from avbench.report.answer import answers
from avbench.report.runs import load_runs


def test_two_sampling_profiles_of_a_pair_stay_apart(tmp_path, run_factory):
    greedy = {"temperature": 0.0, "identical_to_baseline_share": 1.0, "identical_compared": 8}
    t0 = run_factory(tmp_path, "t0", arms=("baseline", "static-k3"), repeats=1,
                     engine={"static-k3": greedy})  # fmt: skip
    t1 = run_factory(tmp_path, "t1", arms=("baseline", "static-k3"), repeats=1,
                     sampling={"temperature": 1.0, "top_p": 0.95})  # fmt: skip
    rs = load_runs([t0.root, t1.root])
    labels = {"tiny (temp 0, top_p 1)", "tiny (temp 1, top_p 0.95)"}
    assert set(rs.cells["pair"]) == labels
    # Each profile its own answer, built from its own run's manifest.
    assert {a.pooled.pair for a in answers(rs)} == labels
    assert rs.manifest_of("tiny (temp 1, top_p 0.95)").run_id == "t1"
    md = write_report([t0.root, t1.root], tmp_path / "out", static_figures=False)
    text = md.markdown.read_text()
    assert (
        "### tiny (temp 1, top_p 0.95) · gsm8k" in text
        and "### tiny (temp 0, top_p 1) · gsm8k" in text
    )
    # The identity check's cells name their run: both runs have a static-k3__gsm8k__c1__rep0.
    assert "| static-k3__gsm8k__c1__rep0 (t0) | 100.0% of 8 |" in text
    # One run alone, or runs at one sampling, keep the plain pair name.
    assert set(load_runs([t1.root]).cells["pair"]) == {"tiny"}
