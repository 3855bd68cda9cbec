"""An arm the pre-flight found vLLM would refuse at start (``SweepOptions.refused_arms``, from
``avbench.checks.av_start``) is never started: the sweep reports it unsupported with vLLM's
reason, not failed, and its exit status stays 0 (the nightly stays green)."""

import json

from avbench.inputs.suite import load_suite
from avbench.run.runner import SweepOptions, start_sweep
from avbench.serving.server import find_free_port
from avbench.store.run_store import RunStore

REASON = (
    "static-k3: vllm 0.33.0 refuses adaptive verification at start: Adaptive verification "
    "replays decode cudagraphs whose per-request query lengths vary up to 4, but "
    "InklingSconvBackend allows none."
)


def test_a_refused_arm_is_reported_unsupported_with_vllms_reason_and_no_server_starts(tmp_path):
    # The installed CPU build would start tiny-cpu's static arm; the refusal stands in for
    # what the pre-flight read from vLLM 0.33 (tests/rehearsal/test_av_start_033.py).
    suite = load_suite()
    sweep = suite.sweep("demo").model_copy(
        update={"arms": ["static"], "k_values": [3], "static_k": "max", "concurrencies": [1]}
    )
    opts = SweepOptions(
        pair=suite.pair("tiny-cpu"),
        sweep=sweep,
        workloads=suite.workloads,
        results_dir=tmp_path,
        run_id="refused",
        port=find_free_port(),
        refused_arms={"static-k3": REASON},
    )
    outcome = start_sweep(opts)
    assert not outcome.failed
    assert {u["arm"] for u in outcome.unsupported} == {"static-k3"}  # each of its cells
    store = RunStore.open(tmp_path / "refused")
    manifest = json.loads(store.manifest_path.read_text())
    entry = next(a for a in manifest["arms"] if a["name"] == "static-k3")
    assert entry["supported"] is False and entry["unsupported_reason"] == REASON
    assert not (store.arm_dir("static-k3") / "server.log").exists()  # never started
    failures = (store.root / "failures.jsonl").read_text()
    assert "unsupported" in failures and "InklingSconvBackend allows none" in failures
