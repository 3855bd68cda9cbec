import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_servers import SharedVllm, TinyK3, VllmWatch, kill_group

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "avbench" / "suites"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# pytest-xdist runs one worker per core: a torch (OpenMP) thread per core in each would spin
# against the other workers.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def fake_server(request):
    """The fake streaming server (``avbench.testing.fake_server``) in its own process, 2 tokens
    a chunk, 1 ms apart (a module may set ``FAKE_INTER_CHUNK_MS``); yields its URL."""
    gap_ms = getattr(request.module, "FAKE_INTER_CHUNK_MS", 1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "avbench.testing.fake_server", "--port", "0",
         "--tokens-per-chunk", "2", "--inter-chunk-ms", str(gap_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def suites_copy(tmp_path: Path) -> Path:
    """A writable copy of the shipped suite files, for tests that break them."""
    dst = tmp_path / "suites"
    shutil.copytree(SUITES, dst)
    return dst


@pytest.fixture
def small_fs(tmp_path: Path):
    """Mounts real size-limited filesystems (tmpfs; needs root): ENOSPC and read-only for real.

    ``small_fs(size_kb)`` returns the mount point; ``small_fs.read_only(path)`` remounts it
    read-only; ``small_fs.fill(dir)`` fills it to the last byte. Unmounted at teardown."""
    import subprocess

    mounts: list[Path] = []

    def mount(size_kb: int) -> Path:
        point = tmp_path / f"fs{len(mounts)}"
        point.mkdir()
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()})")
        mounts.append(point)
        return point

    def read_only(point: Path) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)

    mount.read_only = read_only  # type: ignore[attr-defined]
    mount.fill = _fill_disk  # type: ignore[attr-defined]
    yield mount
    for point in reversed(mounts):
        subprocess.run(["umount", "-l", str(point)], check=False)


def _fill_disk(directory: Path) -> Path:
    """Write zeros into ``directory`` until the filesystem is full (real ENOSPC)."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as fh:
        for size in (1 << 16, 4096, 512, 64, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError:
                continue
    return filler


@pytest.fixture(scope="session")
def vllm_src() -> Path:
    """The GPU build's unpacked source (``make vllm-src``; ``make test`` fetches it first).

    Missing source fails the test rather than skipping it: a rehearsal that silently does not
    run would hide exactly the breakage it exists to catch."""
    from avbench.testing.vllm_source import MissingSource, source_tree

    try:
        return source_tree()
    except MissingSource as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def gpu_vllm_python(vllm_src: Path, tmp_path_factory) -> Path:
    """An interpreter (for ``--vllm-python``) that imports the GPU build's source on CPU."""
    from avbench.testing.vllm_source import rehearsal_python

    return rehearsal_python(vllm_src, tmp_path_factory.mktemp("gpu-vllm"))


@pytest.fixture(scope="session")
def gpu_standin_python(vllm_src: Path, tmp_path_factory) -> Path:
    """``gpu_vllm_python`` that answers vLLM's questions about the machine as an H100 would
    (``avbench.testing.gpu_standin``: CUDA graphs, the model's CUDA implementation,
    FlashAttention 3, DeepGEMM, Model Runner V2); everything else is the CPU's."""
    from avbench.testing.vllm_source import rehearsal_python

    return rehearsal_python(vllm_src, tmp_path_factory.mktemp("gpu-standin"), gpu_stand_in=True)


@pytest.fixture(scope="session")
def seed_hf_home(tmp_path_factory) -> Path:
    """An HF_HOME whose hub cache holds config-only snapshots of every checkpoint the seed
    pairs name (``avbench.testing.hf_cache``): ids resolve offline as after a download."""
    from avbench.testing.hf_cache import seed_cache

    home = tmp_path_factory.mktemp("hf-home")
    seed_cache(home)
    return home


@pytest.fixture
def seed_checkpoints(seed_hf_home: Path, monkeypatch) -> Path:
    """This process and its subprocesses look up checkpoints in ``seed_hf_home``."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(seed_hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(seed_hf_home / "hub"))
    return seed_hf_home


# ----------------------------------------------------------------------------- vLLM servers
# Which tests start vLLM, and the servers they share (tests/vllm_servers.py, docs/testing.md).
_WATCH = VllmWatch()
_SHARED = SharedVllm()


def pytest_sessionstart(session):
    _WATCH.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _WATCH.test = item.nodeid
    yield
    _WATCH.test = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when != "teardown" or item.get_closest_marker("vllm") is not None:
        return
    pids = _WATCH.started_during(item.nodeid)
    if pids:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a vLLM server (pid {', '.join(map(str, pids))}) without the "
            "`vllm` marker: mark it, or serve it the fake server (docs/testing.md)"
        )


def pytest_collection_modifyitems(items):
    """The `vllm` tests last, those sharing a server first among them (it starts once), the
    `quiet` ones at the very end (in `make test` they wait for the tests beside them)."""
    items.sort(key=lambda item: (
        item.get_closest_marker("vllm") is not None,
        item.get_closest_marker("quiet") is not None,
        "shared_vllm" not in getattr(item, "fixturenames", ()),
    ))  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A `quiet` test waits, before any of its fixtures, under `make test`, until the tests run
    beside the `vllm` ones have ended: they hold an exclusive lock on the file named by
    AVBENCH_TESTS_BESIDE until they exit. Beside them a cell of the tiny pair served up to a
    third fewer tokens a second (2 cores, 2026-12-06), far more than priorities explain: their
    process starts and imports."""
    path = os.environ.get("AVBENCH_TESTS_BESIDE")
    if path and item.get_closest_marker("quiet"):
        with open(path) as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)


@pytest.fixture(autouse=True)
def _one_vllm_at_a_time(request):
    """A `vllm` test that launches its own server (no shared one) runs with none shared alive;
    under pytest-xdist each worker would start its own: refused."""
    if not request.node.get_closest_marker("vllm"):
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("a vllm test runs one server at a time: run it without -n (make test does)")
    if "shared_vllm" not in request.fixturenames:
        _SHARED.stop()


@pytest.fixture(scope="session")
def shared_vllm():
    """The session's one shared vLLM server slot (``SharedVllm``); stopped at the end."""
    try:
        yield _SHARED
    finally:
        _SHARED.stop()


@pytest.fixture(scope="session")
def tiny_k3(shared_vllm, tmp_path_factory):
    """``tiny_k3()``: the shared ``TinyK3`` server, started on first use (for module fixtures;
    tests take ``tiny_k3_server``)."""
    return lambda: shared_vllm.get(TinyK3.KEY, lambda: TinyK3.start(tmp_path_factory.mktemp("k3")))


@pytest.fixture
def tiny_k3_server(tiny_k3) -> TinyK3:
    """The tiny pair at static K = 3 with every capture on, behind an API key, shared."""
    return tiny_k3()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    _SHARED.stop()  # Ctrl-C before the fixture's teardown
    _WATCH.stop()
    survivors = _WATCH.survivors()
    for pid in survivors:
        kill_group(pid)
    if survivors:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nvLLM servers outlived the tests (killed now): pids {survivors}", file=sys.stderr)
