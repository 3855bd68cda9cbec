"""Arms side by side write one run directory from several processes at once: every manifest
update and every appended row lands, none lost to another writer's read-modify-write."""

import multiprocessing

from avbench.store.artefacts import PlacementEntry, SweepManifest
from avbench.store.run_store import RunStore

WRITERS, EACH = 4, 15


def _write(root: str, writer: int) -> None:
    store = RunStore.open(root)
    for i in range(EACH):
        arm = f"static-k{writer + 1}"
        store.record_placement(
            PlacementEntry(arm=arm, repeat=i, cells=[], host="h", started_at=f"t{i}")
        )
        store.append_row(store.failures_path, {"cell_id": f"{arm}__{i}", "reason": "x" * 4000})


def test_writers_in_several_processes_lose_nothing(tmp_path):
    store = RunStore.create(tmp_path, "r", {"run_id": "r", "pair": {"name": "p"}})
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write, args=(str(store.root), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    m = store.read_manifest()
    assert isinstance(m, SweepManifest)
    assert len(m.placements) == WRITERS * EACH
    lines = store.failures_path.read_text().splitlines()
    assert len(lines) == WRITERS * EACH and all(line.endswith("}") for line in lines)
