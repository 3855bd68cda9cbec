"""near_ties.json: written whole or not at all, read back as the report reads it."""

import json

import pytest

from avbench.errors import StoreError
from avbench.store.near_ties import NEAR_TIES, read_near_ties, write_near_ties


def test_near_ties_are_written_whole_or_not_at_all(small_fs):
    """A full disk while `avbench quality explain` stores its findings: one-line StoreFull, and
    the file from the run before is still whole (written in place, it was truncated)."""
    run = small_fs(64)
    before = {"summary": {"ties": 1}, "ties": [{"cell_id": "c", "margin": 0.5}]}
    write_near_ties(run, before)
    filler = small_fs.fill(run)
    big = {"summary": {}, "ties": [{"cell_id": f"c{i}", "margin": 0.1} for i in range(5000)]}
    with pytest.raises(StoreError) as exc:
        write_near_ties(run, big)
    assert "\n" not in str(exc.value)
    filler.unlink()
    assert json.loads((run / NEAR_TIES).read_text()) == before
    assert [p.name for p in run.iterdir()] == [NEAR_TIES]  # no staging left behind


def test_a_run_not_explained_has_no_ties_and_an_explained_one_has_its_own(tmp_path):
    assert read_near_ties(tmp_path) == []
    ties = [{"cell_id": "c", "margin": 0.25}]
    write_near_ties(tmp_path, {"summary": {}, "ties": ties})
    assert read_near_ties(tmp_path) == ties
