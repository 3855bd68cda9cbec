"""The page flags the cells measured beside other arms on one host (the manifest's
placements: sweep --gpus, or Ray tasks on one node), and only those."""

from avbench.report import write_report
from avbench.store.artefacts import PlacementEntry
from avbench.store.merge import merge_runs


def _placement(arm: str, start: str, end: str, gpus: list[int], host: str = "h1"):
    cells = [f"{arm}__gsm8k__c{c}__rep0" for c in (1, 4, 16)]
    return PlacementEntry(arm=arm, repeat=0, cells=cells, host=host, gpus=gpus,
                          started_at=f"2026-01-01T00:{start}", ended_at=f"2026-01-01T00:{end}")  # fmt: skip


def test_co_tenant_cells_are_flagged_with_the_arms_beside_them(tmp_path, run_factory):
    store = run_factory(tmp_path, repeats=1, workloads=("gsm8k",))
    placements = [
        _placement("baseline", "00:00", "01:00", [0]),
        _placement("static-k1", "00:30", "01:30", [1]),
        _placement("static-k3", "02:00", "03:00", [0]),  # alone: after both
        _placement("av-k3", "00:10", "00:50", [0], host="h2"),  # another host: not beside
    ]
    store.update_manifest(placements=[p.model_dump() for p in placements])
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "## Co-tenant cells" in md and "each on its own GPUs" in md
    assert "| r1 | baseline__gsm8k__c4__rep0 | static-k1 | 0 |" in md
    assert "| r1 | static-k1__gsm8k__c16__rep0 | baseline | 1 |" in md
    assert "static-k3__gsm8k__c1__rep0 |" not in md.split("## Co-tenant cells")[1]
    assert "av-k3__gsm8k__c1__rep0 |" not in md.split("## Co-tenant cells")[1]


def test_a_merged_run_keeps_its_sources_co_tenant_flags(tmp_path, run_factory):
    one = {"repeats": 1, "workloads": ("gsm8k",)}
    side = run_factory(tmp_path / "a", "side", arms=("baseline", "static-k1"), **one)
    side.update_manifest(
        placements=[
            _placement("baseline", "00:00", "01:00", [0]).model_dump(),
            _placement("static-k1", "00:30", "01:30", [1]).model_dump(),
        ]
    )
    alone = run_factory(tmp_path / "b", "alone", arms=("static-k3", "av-k3"), **one)
    merged = merge_runs([side.root, alone.root], tmp_path / "merged").store
    md = write_report([merged.root], static_figures=False).markdown.read_text()
    flagged = md.split("## Co-tenant cells")[1]
    assert "| merged | baseline__gsm8k__c4__rep0 | static-k1 | 0 |" in flagged, flagged
    assert flagged.count("| merged |") == 6  # both arms' three cells of run side, none of alone


def test_a_run_measured_one_arm_at_a_time_has_no_co_tenant_section(tmp_path, run_factory):
    store = run_factory(tmp_path, repeats=1, workloads=("gsm8k",))
    md = write_report([store.root], static_figures=False).markdown.read_text()
    assert "Co-tenant cells" not in md
