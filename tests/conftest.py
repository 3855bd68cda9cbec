import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def suites_copy(tmp_path: Path) -> Path:
    """A writable copy of the shipped suite files, for tests that break them."""
    dst = tmp_path / "suites"
    shutil.copytree(SUITES, dst)
    return dst
