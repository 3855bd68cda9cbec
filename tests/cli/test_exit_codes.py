"""Every failure path of the CLI: the exit code of the README's table and one line naming the
option or path. Run through the real CLI; attached sweeps talk to the project's scripted
streaming server (or real sockets), faults are real (torn file, full tmpfs, read-only mount)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from avbench.testing.cli import default_sigint, run_cli
from avbench.testing.fake_server import ServerConfig, serve_in_thread


def avbench(*args, env=None, timeout=180):
    env = {k: v for k, v in (os.environ | (env or {})).items() if k != "OPENAI_API_KEY"} | {
        k: v for k, v in (env or {}).items()
    }
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def one_line_error(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def attach(url, results, *extra):
    return (
        "sweep", "--pair", "tiny-cpu", "--endpoint", url, "--arm", "static-k3",
        "--workloads", "gsm8k-tiny", "--concurrencies", "1,2", "--warmup", "0",
        "--requests", "3", "--max-tokens", "8", "--results", str(results), "--no-report", *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fake_server():
    cfg = ServerConfig(model="tiny-target", output_tokens=6, inter_chunk_delay_s=0.01)
    with serve_in_thread(cfg) as srv:
        yield srv


SWEEP = ("sweep", "--pair", "tiny-cpu")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((*SWEEP, "--port", "99999"), "--port: expected a TCP port 1-65535, got 99999"),
        ((*SWEEP, "--ready-timeout", "-5"), "--ready-timeout: expected a finite number > 0"),
        ((*SWEEP, "--run-id", "../../x"), "--run-id '../../x'"),
        ((*SWEEP, "--api-key", "k"), "key of 1 characters refused"),
        ((*SWEEP, "--k", "1,5"), "--k: 5 above max_k 3 of pair tiny-cpu"),
        ((*SWEEP, "--concurrencies", "4,4"), "concurrencies lists 4 more than once"),
        ((*SWEEP, "--workloads", "gsm8k-tiny,gsm8k-tiny"), "workloads lists gsm8k-tiny more"),
        ((*SWEEP, "--arm", "static-k1"), "--arm describes an attached server"),
        ((*SWEEP, "--endpoint", "not a url"), "expected an http:// or https:// URL"),
        ((*SWEEP, "--endpoint", "ftp://127.0.0.1:21"), "expected an http:// or https:// URL"),
        ((*SWEEP, "--endpoint", "http://127.0.0.1:99999"), "port must be 1-65535"),
        (
            (*SWEEP, "--endpoint", "http://127.0.0.1:9", "--arm", "static-k99"),
            "--arm static-k99: K=99 is above max_k 3",
        ),
        ((*SWEEP, "--vllm-python", "/usr/bin/false"), "exited with code 1 and printed nothing"),
        (("lossless", "--pairs", "0"), "--pairs: expected an integer >= 1, got 0"),
        (("lossless", "--pairs", "-5"), "--pairs: expected an integer >= 1, got -5"),
        (("lossless", "--seed", "-1"), "--seed: expected an integer >= 0, got -1"),
        (("trace", "--seed", "-1"), "--seed: expected an integer >= 0, got -1"),
        (("workloads", "show", "gsm8k", "--seed", "-1"), "--seed: expected an integer >= 0"),
    ],
)
def test_bad_input_is_exit_2_and_one_line(tmp_path, args, says):
    res = (
        avbench(*args, "--results", str(tmp_path / "results"))
        if args[0] == "sweep"
        else (avbench(*args))
    )
    assert res.returncode == 2, res.stderr
    assert says in one_line_error(res)
    assert not (tmp_path / "results").exists() and not (tmp_path.parent / "x").exists()


def test_trace_device_and_out(tmp_path):
    import torch

    if not torch.cuda.is_available():
        res = avbench("trace", "--device", "cuda")
        assert res.returncode == 2
        assert "--device cuda: this torch" in one_line_error(res)
    (tmp_path / "file").write_text("x")
    res = avbench("trace", "--out", str(tmp_path / "file"))
    assert res.returncode == 2
    assert f"--out {tmp_path / 'file'}: is a file" in one_line_error(res)


def test_speed_bench_data_dir_with_binary_data(tmp_path):
    (tmp_path / "throughput_2k.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 50)
    res = avbench("workloads", "show", "speed-bench-2k-low", "--data-dir", str(tmp_path))
    assert res.returncode == 2
    assert "not a text JSON Lines file" in one_line_error(res)


def test_plan_k_wins_over_the_pairs_k_values():
    res = avbench("plan", "--pair", "tiny-cpu", "--k", "1")  # the pair itself sets [1, 3]
    assert res.returncode == 0, res.stderr
    assert "static-k1" in res.stdout and "static-k3" not in res.stdout


def test_results_that_is_a_file_or_read_only(tmp_path, small_fs):
    (tmp_path / "f").write_text("x")
    res = avbench(*SWEEP, "--results", str(tmp_path / "f"))
    assert res.returncode == 2 and "is a file, expected a directory" in one_line_error(res)
    ro = small_fs(64)
    small_fs.read_only(ro)
    res = avbench(*SWEEP, "--results", str(ro))
    assert res.returncode == 2 and "not writable" in one_line_error(res)


@pytest.mark.parametrize("kind", ["closed", "not-http", "401"])
def test_attach_to_an_endpoint_that_cannot_serve_fails_before_measuring(tmp_path, kind):
    results = tmp_path / "results"
    if kind == "401":
        with serve_in_thread(ServerConfig(model="tiny-target", api_key="sk-right-key-42")) as srv:
            res = avbench(*attach(srv.base_url, results), env={"OPENAI_API_KEY": "sk-wrong-key"})
        says = "HTTP 401 from /v1/models: the API key was refused"
    elif kind == "closed":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        res = avbench(*attach(f"http://127.0.0.1:{port}", results))
        says = "cannot connect"
    else:  # a real non-HTTP service: greets with an SSH banner and hangs up
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()

        def banner():
            while True:
                try:
                    conn, _ = lsock.accept()
                except OSError:
                    return
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                conn.close()

        threading.Thread(target=banner, daemon=True).start()
        try:
            res = avbench(*attach(f"http://127.0.0.1:{lsock.getsockname()[1]}", results))
        finally:
            lsock.close()
        says = "does not speak HTTP"
    assert res.returncode == 2, res.stderr
    assert says in one_line_error(res)
    assert not results.exists()  # no run directory, so none is left `running`


def test_options_given_with_resume_are_refused(tmp_path):
    res = avbench("sweep", "--resume", str(tmp_path), "--k", "1", "--workloads", "gsm8k")
    assert res.returncode == 2
    assert "refusing --workloads, --k" in one_line_error(res)


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"{}", "no 'pair' key"), (b"[]", "a JSON list"), (b"\x00\xff\x10binary", "not JSON")],
)
def test_resume_with_a_broken_manifest(tmp_path, content, says):
    (tmp_path / "manifest.json").write_bytes(content)
    res = avbench("sweep", "--resume", str(tmp_path))
    assert res.returncode == 2 and says in one_line_error(res)


@pytest.mark.slow
def test_torn_cells_jsonl_then_resume_measures_it_once(tmp_path, fake_server):
    res = avbench(*attach(fake_server.base_url, tmp_path, "--run-id", "r"))
    assert res.returncode == 0, res.stderr
    run = tmp_path / "r"
    cells = run / "cells.jsonl"
    first, second = cells.read_text().splitlines()
    cells.write_text(first + "\n" + second[: len(second) // 2])  # crash mid-append
    res = avbench("sweep", "--resume", str(run), "--no-report")
    assert res.returncode == 0, res.stderr
    assert "warning:" in res.stderr and "cells.jsonl.torn" in res.stderr
    assert "1 cells measured, 1 already done, 0 failed" in res.stderr
    ids = [json.loads(x)["cell_id"] for x in cells.read_text().splitlines()]
    assert ids == [json.loads(first)["cell_id"], json.loads(second)["cell_id"]]
    assert (run / "cells.jsonl.torn").read_text() == second[: len(second) // 2] + "\n"
    res = avbench("sweep", "--resume", str(run), "--no-report")  # nothing left to do
    assert "0 cells measured, 2 already done" in res.stderr and res.returncode == 0
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_disk_full_mid_run_is_one_line_and_resume_completes(tmp_path, small_fs):
    fs = small_fs(1024)
    cfg = ServerConfig(model="tiny-target", output_tokens=30, inter_chunk_delay_s=0.05)
    with serve_in_thread(cfg) as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "avbench.cli", *attach(srv.base_url, fs, "--run-id", "r")],
            stderr=subprocess.PIPE,
            text=True,
        )
        cells = fs / "r" / "cells.jsonl"
        deadline = time.monotonic() + 120
        while not (cells.exists() and cells.read_text().endswith("\n")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        filler = small_fs.fill(fs)  # the second cell is now running: its writes hit ENOSPC
        err = proc.communicate(timeout=120)[1]
        assert proc.returncode == 1, err
        assert "no space left on device" in one_line_error(
            subprocess.CompletedProcess([], 1, "", err)
        )
        assert f"--resume {fs / 'r'}" in err
        assert len(cells.read_text().splitlines()) == 1
        manifest = json.loads((fs / "r" / "manifest.json").read_text())  # still whole
        assert manifest["status"] in ("failed", "running")
        filler.unlink()
        res = avbench("sweep", "--resume", str(fs / "r"), "--no-report")
        assert res.returncode == 0, res.stderr
    ids = [json.loads(x)["cell_id"] for x in cells.read_text().splitlines()]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert json.loads((fs / "r" / "manifest.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_report_on_a_read_only_run_dir(tmp_path, small_fs, fake_server):
    fs = small_fs(2048)
    res = avbench(*attach(fake_server.base_url, fs, "--run-id", "r"))
    assert res.returncode == 0, res.stderr
    small_fs.read_only(fs)
    res = avbench("report", str(fs / "r"), "--no-figures")
    assert res.returncode == 2, res.stderr
    assert "Read-only file system" in one_line_error(res)
    res = avbench("sweep", "--resume", str(fs / "r"))
    assert res.returncode == 2 and "not writable" in one_line_error(res)


def _leftovers(run: Path) -> list[str]:
    """Hidden staging or temp files a failed write could leave in a run directory."""
    return sorted(p.name for p in run.iterdir() if p.name.startswith("."))


# The commands below run in this process (run_cli): the same entry point and exit codes,
# without an interpreter and the tiny pair's tokenizer loaded again per command.
def test_report_on_a_full_disk_is_one_line_and_keeps_the_last_page(small_fs, fake_server):
    fs = small_fs(4096)
    res = run_cli(*attach(fake_server.base_url, fs, "--run-id", "r"))
    assert res.returncode == 0, res.stderr
    run = fs / "r"
    filler = small_fs.fill(fs)
    res = run_cli("report", str(run), "--no-figures")
    assert res.returncode == 1, res.stderr
    assert "no space left on device while writing the report" in one_line_error(res)
    assert not (run / "report.html").exists() and not (run / "report.md").exists()
    assert _leftovers(run) == []
    filler.unlink()
    assert run_cli("report", str(run), "--no-figures").returncode == 0
    page, summary = (run / "report.html").read_bytes(), (run / "report.md").read_bytes()
    filler = small_fs.fill(fs)
    res = run_cli("report", str(run), "--no-figures")
    assert res.returncode == 1 and "no space left" in one_line_error(res)
    # Nothing partial: the previous page and summary are still whole.
    assert (run / "report.html").read_bytes() == page
    assert (run / "report.md").read_bytes() == summary
    assert _leftovers(run) == []


def test_full_disk_at_the_end_of_a_sweep_keeps_every_cell(small_fs, fake_server):
    fs = small_fs(1024)  # the cells fit, the 2 MB page does not
    args = [a for a in attach(fake_server.base_url, fs, "--run-id", "r") if a != "--no-report"]
    res = run_cli(*args)
    assert res.returncode == 1, res.stderr
    assert "no space left on device while writing the report" in one_line_error(res)
    run = fs / "r"
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
    assert len((run / "cells.jsonl").read_text().splitlines()) == 2
    assert not (run / "report.html").exists() and _leftovers(run) == []
    subprocess.run(["mount", "-o", "remount,size=4096k", str(fs)], check=True)
    res = run_cli("report", str(run), "--no-figures")
    assert res.returncode == 0, res.stderr


def test_full_disk_at_run_creation_leaves_no_run_to_resume(small_fs, fake_server):
    fs = small_fs(64)
    small_fs.fill(fs)
    res = run_cli(*attach(fake_server.base_url, fs / "results", "--run-id", "r"))
    assert res.returncode == 1, res.stderr
    line = one_line_error(res)
    assert "no space left on device; no run was created" in line and "--resume" not in res.stderr
    assert not (fs / "results" / "r").exists()


@pytest.mark.slow
def test_unsupported_arm_is_exit_0_unless_strict(tmp_path):
    from avbench.serving.server import probe_vllm

    if not probe_vllm(sys.executable).is_cpu_build:
        pytest.skip("AV is unsupported only on the CPU build")
    from avbench.serving.server import find_free_port

    # Its own port: the sweep refuses a port in use before it judges the arms.
    port = str(find_free_port())
    args = (*SWEEP, "--arms", "av", "--port", port, "--results", str(tmp_path), "--no-report")
    res = avbench(*args, "--run-id", "plain")
    assert res.returncode == 0, res.stderr
    assert "0 cells measured, 0 already done, 0 failed, 4 unsupported" in res.stderr
    res = avbench(*args, "--run-id", "strict", "--strict")
    assert res.returncode == 3, res.stderr
    manifest = json.loads((tmp_path / "strict" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["counts"]["unsupported"] > 0


def test_internal_error_is_exit_4_with_a_saved_traceback(tmp_path, monkeypatch, capsys):
    # Stands in for a bug inside a running sweep: the store's reader breaks mid-run.
    import avbench.cli
    from avbench.store.run_store import RunStore

    def broken(self):
        raise RuntimeError("bug in sk-secret-key-123 handling")

    monkeypatch.setattr(RunStore, "finished_cells", broken)
    monkeypatch.setattr(
        sys, "argv", ["avbench", *attach("http://127.0.0.1:9", tmp_path, "--run-id", "r")]
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-key-123")
    with serve_in_thread(ServerConfig(model="tiny-target")) as srv:
        sys.argv[sys.argv.index("http://127.0.0.1:9")] = srv.base_url
        with pytest.raises(SystemExit) as exc:
            avbench.cli.main()
    assert exc.value.code == 4
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    saved = tmp_path / "r" / "traceback.txt"
    assert line.endswith(f"traceback saved to {saved}") and "RuntimeError" in line
    assert "sk-secret-key-123" not in line and "***" in line
    text = saved.read_text()
    assert "Traceback" in text and "broken" in text and "sk-secret-key-123" not in text
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "RuntimeError" in manifest["error"]


def test_internal_error_before_a_run_exists_saves_to_a_temp_file(monkeypatch, capsys):
    import avbench.cli
    import avbench.inputs.suite

    def broken(*a, **k):
        raise KeyError("stands in for a bug while loading suites")

    monkeypatch.setattr(avbench.inputs.suite, "load_suite", broken)
    monkeypatch.setattr(sys, "argv", ["avbench", "pairs"])
    with pytest.raises(SystemExit) as exc:
        avbench.cli.main()
    assert exc.value.code == 4
    line = capsys.readouterr().err.strip()
    path = Path(line.rsplit("traceback saved to ", 1)[1])
    assert line.startswith("error: internal error (KeyError") and path.is_file()
    assert "stands in for a bug" in path.read_text()
    path.unlink()


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("arms = []", "sweep demo: arms is empty"),
        ("rates = [2.0, 0.0]", "sweep demo: rates must be a non-empty list of positive req/s"),
        ("rates = [3.0, 3.0]", "sweep demo: rates lists 3.0 more than once"),
    ],
)
def test_suite_sweeps_that_cannot_be_planned(suites_copy, line, says):
    sweeps = suites_copy / "sweeps.toml"
    text = sweeps.read_text()
    sweeps.write_text(text.replace("[sweeps.demo]\n", f"[sweeps.demo]\n{line}\n", 1))
    res = avbench("plan", "--pair", "tiny-cpu", "--suites", str(suites_copy))
    assert res.returncode == 2 and says in one_line_error(res)


@pytest.mark.slow
def test_ctrl_c_prints_the_run_directory_to_resume(tmp_path):
    cfg = ServerConfig(model="tiny-target", output_tokens=40, inter_chunk_delay_s=0.05)
    with serve_in_thread(cfg) as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "avbench.cli", *attach(srv.base_url, tmp_path, "--run-id", "r")],
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
        )
        deadline = time.monotonic() + 120
        while srv.stats()["requests"] < 1:  # measuring
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    assert f"finish the run with --resume {tmp_path / 'r'}" in err
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["status"] == "interrupted"
