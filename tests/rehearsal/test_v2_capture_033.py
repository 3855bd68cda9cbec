"""The plugin's Model Runner V2 capture driven by vLLM 0.33.0's own classes, on CPU.

``v2_step_033.py`` (run in a subprocess with the 0.33 source first on the path; what it builds
for real and what it stands in for is listed there) scripts AV and static engine steps with a
known admitted count per request; this test checks the labels, the counts of vLLM's own
estimator and the features the plugin filed.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.testing.vllm_source import rehearsal_env

pytest.importorskip("triton")

# vLLM 0.33 imported and stepped in a subprocess (about 11 s), shared by the module.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("v2_step_033.py")


@pytest.fixture(scope="module")
def rehearsal(vllm_src, tmp_path_factory) -> dict:
    capture = tmp_path_factory.mktemp("capture")
    env = rehearsal_env(vllm_src) | {
        "TRITON_INTERPRET": "1",
        "AVBENCH_CAPTURE_DIR": str(capture),
        "AVBENCH_CAPTURE": "drafts,refits",
    }
    res = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    from avbench.capture_protocol import estimators_since

    seen = json.loads(res.stdout.strip().splitlines()[-1])
    return seen | {"estimators": estimators_since(capture, 0.0)}


def test_hooks_install_on_033s_classes_and_run_clean(rehearsal):
    assert set(rehearsal["installed"]) == {
        "GPUModelRunner.execute_model (drafts-v2)",
        "GPUModelRunner.sample_tokens (drafts-v2)",
        "DraftModelSpeculator.observe_verification (drafts-v2)",
    }
    assert rehearsal["inert"] == [] and rehearsal["errors"] == {}


def test_av_step_labels_and_the_estimators_own_counts(rehearsal):
    """Admitted 4 / 2 / 0 of 4 scheduled, accepted 1 / 2 / 0: num_rejected from 0.33's own
    kernel, labels accepted / first rejected / after rejection / trimmed, and the accepted and
    first-rejected labels per position equal what vLLM's estimator counted."""
    assert rehearsal["av_num_rejected"] == [3, 0, 0]
    labels = rehearsal["labels"]
    assert labels["cmpl-a"] == [1, 0, -1, -1]
    assert labels["cmpl-b"] == [1, 1, -2, -2]
    assert labels["cmpl-c"] == [-2, -2, -2, -2]
    graded = [sum(labels[r][k] in (0, 1) for r in ("cmpl-a", "cmpl-b", "cmpl-c")) for k in range(4)]
    assert graded == rehearsal["av_counts"] == [2, 2, 0, 0]


def test_av_rows_carry_the_estimators_feature_and_prediction(rehearsal):
    f = [x for r in ("cmpl-a", "cmpl-b", "cmpl-c") for x in rehearsal["f"][r]]
    pred = [x for r in ("cmpl-a", "cmpl-b", "cmpl-c") for x in rehearsal["pred"][r]]
    assert f == rehearsal["av_f"] and pred == rehearsal["av_pred"]
    assert rehearsal["av_own_predicts"] == 0  # AV: no feature kernels of our own
    # The refit capture saw 0.33's estimator step (the static arm has none): cells say "online".
    (marker,) = rehearsal["estimators"]
    assert marker["num_speculative_steps"] == 4


def test_static_step_uses_033s_kernels_compiled_on_the_first_step(rehearsal):
    """No estimator: our feature from 0.33's kernels, one per-row-step predict per step for
    the whole step (3 requests x K 4), after one single-row call on the first step."""
    assert rehearsal["static_predicts_first_step"] == [[1, 4], [3, 4]]
    assert rehearsal["static_predicts"] == 3
    labels = rehearsal["labels"]
    assert labels["cmpl-d"] == [1, 1, 0, -1]
    assert labels["cmpl-e"] == [0, -1, -1, -1]
    assert labels["cmpl-f"] == [1, 1, 1, 1]
    f = [x for r in ("cmpl-d", "cmpl-e", "cmpl-f") for x in rehearsal["f"][r]]
    assert f == rehearsal["static_f_numpy"]
    assert all(math.isnan(p) for r in ("cmpl-d", "cmpl-e", "cmpl-f") for p in rehearsal["pred"][r])
