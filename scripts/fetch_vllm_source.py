"""Fetch the GPU build of vLLM (a wheel from the package registry) and unpack its Python source.

The rehearsal tests import this source in subprocesses, on CPU, to run avbench's GPU-only paths
against the vLLM a GPU user installs; the GPU check script carries kernel files from it to a
machine without vLLM. Nothing is installed: the wheel is downloaded with ``pip download
--no-deps`` and only its text files (Python, JSON, templates, package metadata) are unpacked;
the compiled CUDA libraries are left out (they cannot load on CPU).

The tree appears under its final name only when complete (unpacked beside it, then renamed),
so an interrupted fetch is simply redone. The wheel's sha256 is checked against the one
recorded here for its file name (:data:`WHEEL_SHA256`) before anything is unpacked: a wheel
with another hash, or one no hash is recorded for, is refused (``--sha256 HEX`` accepts a
wheel whose hash was checked elsewhere, e.g. another platform's).

    python scripts/fetch_vllm_source.py --version 0.33.0 --dest ~/.cache/avbench/vllm-0.33.0
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

KEEP_SUFFIXES = (".py", ".json", ".jinja")
SKIP_PREFIXES = ("vllm/third_party/",)
# sha256 of each wheel this script has fetched, by file name (recorded 2026-12-05 from
# `pip download --no-deps vllm==0.33.0` on linux x86_64).
WHEEL_SHA256 = {
    "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl": (
        "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
    ),
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_wheel(wheel: Path, expected: str | None = None) -> None:
    """Refuse (one line) a wheel whose sha256 is not the one recorded for its name
    (or ``expected``, when given)."""
    want = expected or WHEEL_SHA256.get(wheel.name)
    if want is None:
        raise SystemExit(
            f"fetch_vllm_source: no sha256 is recorded for {wheel.name} (WHEEL_SHA256 in "
            f"{Path(__file__).name}); check it and pass --sha256"
        )
    got = sha256(wheel)
    if got != want.lower():
        raise SystemExit(
            f"fetch_vllm_source: {wheel.name} has sha256 {got}, not the recorded {want}: "
            "refused (nothing unpacked)"
        )


def unpack(wheel: Path, dest: Path) -> int:
    """Unpack the wheel's text files into ``dest``; returns how many were written."""
    n = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir() or name.startswith(SKIP_PREFIXES):
                continue
            if not (name.endswith(KEEP_SUFFIXES) or ".dist-info/" in name):
                continue
            zf.extract(info, dest)
            n += 1
    return n


def fetch(version: str, dest: Path, expected: str | None = None) -> Path:
    if (dest / "vllm" / "__init__.py").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        tmp_path = Path(tmp)
        res = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
             "-d", str(tmp_path / "wheel"), f"vllm=={version}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        wheels = sorted((tmp_path / "wheel").glob(f"vllm-{version}-*.whl"))
        if res.returncode != 0 or not wheels:
            said = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise SystemExit(f"fetch_vllm_source: pip download vllm=={version} failed: {said[0]}")
        check_wheel(wheels[0], expected)
        tree = tmp_path / "tree"
        count = unpack(wheels[0], tree)
        if not (tree / "vllm" / "__init__.py").exists():
            raise SystemExit(f"fetch_vllm_source: {wheels[0].name} holds no vllm package")
        if dest.exists():
            shutil.rmtree(dest)
        tree.rename(dest)
    print(f"vLLM {version} source: {count} files in {dest}")
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", required=True)
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--sha256", help="the wheel's sha256, where none is recorded for it here")
    args = ap.parse_args()
    fetch(args.version, args.dest.expanduser(), args.sha256)


if __name__ == "__main__":
    main()
