"""Refit capture: vLLM's real estimator and Triton kernels (interpreter) against our numpy one.

The end-to-end test runs ``scripts/gpu_check_estimator.py --cpu`` in a subprocess: vLLM's
installed ``acceptance_estimator.py`` with its Triton kernels in Triton's interpreter
(``TRITON_INTERPRET=1`` must be set before Triton is imported, and the CPU build of vLLM would
hand the module a Triton placeholder, so it gets a process of its own). The other tests drive
the wrapper with a small stand-in class where a fault has to be injected into the estimator.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from avbench.capture_protocol import estimators_since, refit_lines
from avbench.estimator.online import EstimatorConfig, replay
from avbench.serving.capture import RefitCaptureError, read_refits
from avbench.testing.vllm_kernels import installed_vllm_dir
from avbench.vllm_plugin import refits as refits_mod
from avbench.vllm_plugin.refits import ESTIMATOR_MODULE, flush_refits, install_refit_capture

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check_estimator.py"
STEPS, POSITIONS = 350, 2


def _need_kernels() -> None:
    pytest.importorskip("triton", reason="triton is not installed: vLLM's kernels cannot run")
    if installed_vllm_dir() is None:
        pytest.skip("vLLM is not installed: no estimator source to test against")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    _need_kernels()
    out = tmp_path_factory.mktemp("refits")
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--steps", str(STEPS)]
    cmd += ["--requests", "2", "--positions", str(POSITIONS), "--vocab", "64", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


@pytest.mark.slow
def test_real_estimator_refits_are_logged_and_equal_numpy(real_run):
    lines = read_refits(real_run)
    obs = np.load(real_run / "observed.npy")
    call, pos, lab, feat = (
        obs[:, 0].astype(np.int64),
        obs[:, 1].astype(np.int64),
        obs[:, 2],
        obs[:, 3],
    )
    empty = STEPS - len(np.unique(call))
    assert empty > 20  # calls that graded nothing are part of the load
    # One line per 100 step() calls, empty calls included.
    assert lines["refit_index"].tolist() == [0, 1, 2]
    assert lines["step_count"].tolist() == [100, 200, 300]
    assert lines["pid"].nunique() == 1 and (lines["capture_errors"] == 0).all()
    (marker,) = estimators_since(real_run, 0.0)  # vLLM's real estimator stepped here
    assert marker["pid"] == lines["pid"].iloc[0] and marker["num_speculative_steps"] == POSITIONS
    ref = replay(call, pos, lab, feat, EstimatorConfig(num_positions=POSITIONS), num_steps=STEPS)
    assert len(ref.refits) == 3
    for r_np, r_v in zip(ref.refits, lines.itertuples(), strict=True):
        assert list(r_v.label_counts) == r_np.n.astype(int).tolist()
        assert sum(r_v.label_counts) > 0
        np.testing.assert_allclose(r_v.slope, r_np.omega, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r_v.intercepts, r_np.beta, rtol=1e-5, atol=1e-6)
    assert lines["slope"].iloc[-1] != 0.5
    summary = json.loads((real_run / "summary.json").read_text())
    assert summary["problems"] == []  # incl. bitwise equality with the bare, unwrapped class


class StandIn:
    """Stands in for vLLM's OnlineAcceptanceEstimator (same attributes and ``step`` signature)
    where a fault is injected: torch arithmetic instead of Triton kernels."""

    REFIT_INTERVAL = 100

    def __init__(self, k: int = 2):
        import torch

        self._steps_since_refit = 0
        self._refits = 0
        self.slope = torch.full((1,), 0.5)
        self.intercepts = torch.full((k,), -0.2)
        self.counts = torch.zeros(k)

    def step(self, idx_mapping, num_sampled, num_rejected):
        n = int(idx_mapping.shape[0])
        self.counts[0] += n
        self._steps_since_refit += 1
        if self._steps_since_refit < self.REFIT_INTERVAL:
            return
        self._steps_since_refit = 0
        self.intercepts += 0.1
        self.counts.zero_()
        self._refits += 1


class BrokenCounts:
    def clone(self):
        raise RuntimeError("injected fault")

    def __getitem__(self, i):
        return 0

    def __setitem__(self, i, v):
        pass

    def zero_(self):
        pass


@pytest.fixture
def stand_in(monkeypatch):
    """Installs a module named like vLLM's estimator module holding a fresh StandIn class."""
    cls = type("OnlineAcceptanceEstimator", (StandIn,), {})
    mod = types.ModuleType(ESTIMATOR_MODULE)
    mod.OnlineAcceptanceEstimator = cls
    monkeypatch.setitem(sys.modules, ESTIMATOR_MODULE, mod)
    monkeypatch.setattr(refits_mod, "_capture", None)
    return cls


def _drive(est, calls: int, n: int = 3) -> None:
    import torch

    idx = torch.arange(n, dtype=torch.int32)
    for i in range(calls):
        m = n if i % 3 else 0  # every third call observes nothing
        est.step(idx[:m], idx[:m], idx[:m])


def test_stand_in_lines_carry_counts_of_the_round(stand_in, tmp_path):
    assert install_refit_capture(tmp_path)
    est = stand_in()
    _drive(est, 250)
    flush_refits()
    lines = read_refits(tmp_path)
    # Counts are read before the refit zeroes them: 2 of every 3 calls add 3.
    assert lines["label_counts"].tolist() == [[198, 0], [201, 0]]
    assert lines["step_count"].tolist() == [100, 200]
    np.testing.assert_allclose(lines["intercepts"].tolist(), [[-0.1, -0.1], [0.0, 0.0]], atol=1e-6)
    assert est._steps_since_refit == 50 and est._refits == 2
    (marker,) = estimators_since(tmp_path, 0.0)  # one per process, at the first step()
    assert marker["pid"] == os.getpid() and marker["time"] <= lines["time"].min()
    assert estimators_since(tmp_path, marker["time"] + 1) == []


class SlowCopy:
    """Stands in for the CUDA event of a device-to-host copy that lands after ``delay_s``."""

    def __init__(self, delay_s: float):
        self.done = threading.Event()
        threading.Timer(delay_s, self.done.set).start()

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.done.wait()


def test_a_refit_line_lands_without_a_later_step_or_exit(stand_in, tmp_path, monkeypatch):
    """A worker may go idle after its last refit and be SIGKILLed once vLLM's shutdown grace
    runs out: the line must be on disk once its copy lands, not at the next step() or exit."""
    monkeypatch.setattr(refits_mod, "_to_host", lambda values: (values, SlowCopy(0.3)))
    assert install_refit_capture(tmp_path)
    est = stand_in()
    _drive(est, 100)  # one refit; its copy is still "in flight"
    assert refit_lines(tmp_path) == []
    deadline = time.monotonic() + 10
    while not refit_lines(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)  # no step(), no flush: only the writer thread can write it
    lines = refit_lines(tmp_path)
    assert [(r["refit_index"], r["step_count"]) for r in lines] == [(0, 100)]
    assert lines[0]["label_counts"] == [198, 0]


def test_an_exception_inside_the_wrapper_is_counted_not_raised(stand_in, tmp_path, caplog):
    assert install_refit_capture(tmp_path)
    est = stand_in()
    good = est.counts
    est.counts = BrokenCounts()
    with caplog.at_level(logging.WARNING):
        _drive(est, 100)  # the snapshot at the refit boundary raises inside the wrapper
    assert est._refits == 1 and est._steps_since_refit == 0  # the refit still happened
    assert "injected fault" in caplog.text
    est.counts = good
    _drive(est, 100)
    flush_refits()
    lines = read_refits(tmp_path)
    assert lines["refit_index"].tolist() == [1]  # the faulty round wrote nothing
    assert lines["capture_errors"].tolist() == [1]


def test_a_differing_class_is_left_untouched(stand_in, tmp_path, caplog):
    def step(self, idx_mapping, num_sampled):  # a future vLLM's signature
        return None

    stand_in.step = step
    with caplog.at_level(logging.WARNING):
        assert not install_refit_capture(tmp_path)
    assert stand_in.step is step
    assert "differs from the expected" in caplog.text and "vllm" in caplog.text


def test_an_instance_without_the_expected_state_stays_inert(stand_in, tmp_path, caplog):
    assert install_refit_capture(tmp_path)
    est = stand_in()
    del est.slope  # a version that keeps its coefficients elsewhere
    with caplog.at_level(logging.WARNING):
        _drive(est, 100)
    assert est._refits == 1 and est._steps_since_refit == 0  # the class's own step ran
    assert "has no slope" in caplog.text
    assert read_refits(tmp_path).empty


def test_read_refits_skips_a_torn_last_line_only(tmp_path):
    line = {
        "time": 1.0, "pid": 5, "tp_rank": 0, "dp_rank": None, "refit_index": 0,
        "step_count": 100, "slope": 0.6, "intercepts": [0.1, -0.3], "label_counts": [40, 12],
        "capture_errors": 0,
    }  # fmt: skip
    path = tmp_path / "arm" / "refits.5.jsonl"
    path.parent.mkdir()
    text = "".join(json.dumps(line | {"refit_index": i}) + "\n" for i in range(3))
    path.write_text(text)
    with path.open("r+b") as fh:  # a process killed mid-write: the last line is cut short
        fh.truncate(len(text.encode()) - 25)
    df = read_refits(tmp_path)
    assert (
        df["refit_index"].tolist() == [0, 1] and df["file"].tolist() == ["arm/refits.5.jsonl"] * 2
    )
    lines = text.splitlines()
    path.write_text("\n".join([lines[0], lines[1][:30], lines[2]]) + "\n")
    with pytest.raises(RefitCaptureError, match=r"refits\.5\.jsonl:2: not a refit line"):
        read_refits(tmp_path)
    with pytest.raises(RefitCaptureError, match="not a directory"):
        read_refits(tmp_path / "missing")


def test_check_script_without_a_gpu_says_so(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would run the check")
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2
    assert "no CUDA GPU here" in res.stderr and "--cpu" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_kernels_load_from_a_copy_of_the_listed_source_files(tmp_path):
    _need_kernels()
    from avbench.testing.vllm_kernels import NEWER_FILES, SOURCE_FILES

    src = tmp_path / "vllm"
    for rel in SOURCE_FILES:  # what a GPU machine without vLLM gets carried to it
        if rel in NEWER_FILES and not (installed_vllm_dir() / rel).exists():
            continue  # a file of later vLLMs this installed one does not have
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes((installed_vllm_dir() / rel).read_bytes())
    code = (
        "import sys; from pathlib import Path;"
        "from avbench.testing.vllm_kernels import load_estimator_module;"
        "m = load_estimator_module(Path(sys.argv[1]));"
        "print(m.__file__, m.OnlineAcceptanceEstimator.REFIT_INTERVAL)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(src)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [str(src / SOURCE_FILES[0]), "100"]
    (src / SOURCE_FILES[1]).unlink()
    res = subprocess.run(
        [sys.executable, "-c", code, str(src)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode != 0 and "missing vLLM source file(s)" in res.stderr
