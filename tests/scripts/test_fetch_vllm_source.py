"""scripts/fetch_vllm_source.py refuses a wheel whose sha256 is not the one recorded for it,
before unpacking anything (``make vllm-src`` runs it; the rehearsal tier imports what it
unpacks)."""

from __future__ import annotations

import hashlib

import pytest

from avbench.testing.scripts import load_script

fetch = load_script("fetch_vllm_source")

RECORDED = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def test_the_pinned_release_has_a_recorded_hash():
    assert RECORDED in fetch.WHEEL_SHA256 and len(fetch.WHEEL_SHA256[RECORDED]) == 64


def test_a_wheel_with_another_hash_is_refused_in_one_line(tmp_path):
    wheel = tmp_path / RECORDED
    wheel.write_bytes(b"not the wheel pip fetched on the day the hash was recorded")
    with pytest.raises(SystemExit) as exc:
        fetch.check_wheel(wheel)
    said = str(exc.value)
    assert "\n" not in said and f"not the recorded {fetch.WHEEL_SHA256[RECORDED]}" in said
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() in said


def test_a_wheel_without_a_recorded_hash_needs_one_given(tmp_path):
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"
    wheel.write_bytes(b"another platform's wheel")
    with pytest.raises(SystemExit, match="no sha256 is recorded for .*pass --sha256"):
        fetch.check_wheel(wheel)
    fetch.check_wheel(wheel, hashlib.sha256(wheel.read_bytes()).hexdigest())  # accepted
