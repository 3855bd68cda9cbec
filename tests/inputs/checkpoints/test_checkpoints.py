"""Sub-folder drafters: resolved in the local Hugging Face cache (real huggingface_hub lookups
in a cache built in the test), refused in one line where the repository is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from avbench.inputs import checkpoints
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.serving.server import missing_checkpoints
from avbench.store.failures import FailureKind
from avbench.testing.hf_cache import REVISION

MIMO = "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash"


def test_which_ids_are_subfolders(tmp_path, monkeypatch):
    sub = checkpoints.subfolder_ref(f"{MIMO}/dflash")
    assert (sub.repo, sub.subfolder) == (MIMO, "dflash")
    assert checkpoints.subfolder_ref("org/repo/a/b").subfolder == "a/b"
    for ref in (MIMO, "gpt2", "/abs/path/x", "./rel/a/b", "~/x/y/z", "@assets/tiny/target", None):
        assert checkpoints.subfolder_ref(ref) is None, ref
    local = tmp_path / "a" / "b" / "c"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # a relative path that exists is a local directory, not an id
    assert checkpoints.subfolder_ref("a/b/c") is None


def test_resolved_in_the_snapshot_else_left_as_written_with_one_line(
    seed_checkpoints, tmp_path, monkeypatch
):
    folder = (
        seed_checkpoints
        / "hub"
        / f"models--{MIMO.replace('/', '--')}"
        / "snapshots"
        / REVISION
        / "dflash"
    )
    assert checkpoints.resolve(f"{MIMO}/dflash") == str(folder)
    assert checkpoints.resolve(MIMO) == MIMO  # vLLM resolves plain ids itself
    assert checkpoints.missing("drafter", f"{MIMO}/dflash") is None
    line = checkpoints.missing("drafter", f"{MIMO}/nope")
    assert "has no folder 'nope'" in line and f"`hf download {MIMO}`" in line
    pair = load_suite().pair("mimo-dflash")
    assert missing_checkpoints(pair, Arm("static", 8)) == []

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    assert checkpoints.resolve(f"{MIMO}/dflash") == f"{MIMO}/dflash"
    ((ref, line),) = missing_checkpoints(pair, Arm("av", 8))
    assert ref == f"{MIMO}/dflash" and "\n" not in line
    assert line == (
        f"drafter {MIMO}/dflash is a folder of the repository {MIMO}, which vLLM loads only "
        f"from a local directory, and {MIMO} is not in the local Hugging Face cache: download "
        f"it with `hf download {MIMO}`"
    )
    assert missing_checkpoints(pair, Arm("baseline")) == []  # the baseline has no drafter


@pytest.mark.parametrize("cached", [True, False])
def test_plan_shows_the_resolution_with_or_without_the_weights(cached, seed_hf_home, tmp_path):
    home = seed_hf_home if cached else tmp_path
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "plan", "--pair", "mimo-dflash", "--sweep", "nightly"],
        capture_output=True, text=True, env=os.environ | {"HF_HOME": str(home), "COLUMNS": "400"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (line,) = [x.strip() for x in res.stdout.splitlines() if x.strip().startswith("drafter ")]
    if cached:
        assert line.endswith(f"/snapshots/{REVISION}/dflash (local snapshot)"), line
        assert f"/snapshots/{REVISION}/dflash" in res.stdout.split("static-k8: ", 1)[1]
    else:
        assert line == (
            f"drafter {MIMO}/dflash -> <local snapshot of {MIMO}>/dflash at launch; "
            f"not downloaded here (`hf download {MIMO}`)"
        )


def test_a_launch_without_the_snapshot_fails_the_arm_in_one_line_and_starts_nothing(
    tmp_path, monkeypatch
):
    """The runner refuses the arm before any server (pre-flight says so first in a sweep)."""
    from huggingface_hub import constants

    from avbench.run.runner import SweepOptions, start_sweep
    from avbench.serving.server import find_free_port, probe_vllm

    if probe_vllm(sys.executable).distribution is None:
        pytest.skip("vLLM is not installed: the runner refuses to launch before this check")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    suite = load_suite()
    pair = suite.pair("tiny-cpu").model_copy(update={"drafter": "someorg/somerepo/drafter"})
    sweep = suite.sweep("demo").model_copy(update={"arms": ["static"], "k_values": [3]})
    out = start_sweep(
        SweepOptions(
            pair=pair,
            sweep=sweep,
            workloads=suite.workloads,
            results_dir=tmp_path,
            run_id="r",
            port=find_free_port(),
        )
    )
    failures = out.store.failures()
    assert failures and {f.kind for f in failures} == {FailureKind.SERVER}
    assert all("`hf download someorg/somerepo`" in f.reason for f in failures)
    assert not list((tmp_path / "r").rglob("server.log"))  # no server was started
