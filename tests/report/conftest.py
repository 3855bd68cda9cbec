"""Hand-made run directories for the report tests (written through the real RunStore)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from avbench.loadgen.records import RequestRecord
from avbench.store.failures import CellFailure
from avbench.store.run_store import RunStore

# Throughput multiplier per arm; static-k1 wins at c=16.
GAIN = {"baseline": 1.0, "static-k1": 1.3, "static-k3": 1.5, "av-k3": 1.6}


def make_run(
    root: Path,
    run_id: str = "r1",
    *,
    arms=("baseline", "static-k1", "static-k3", "av-k3"),
    workloads=("gsm8k", "humaneval"),
    concurrencies=(1, 4, 16),
    rates=(),
    repeats: int = 2,
    av_unsupported: bool = False,
    av_captured: bool = False,
    engine: dict[str, dict] | None = None,  # arm -> what its server chose (cell columns)
    sampling: dict | None = None,
) -> RunStore:
    """A run of closed-loop cells at ``concurrencies`` and open-loop cells at ``rates``."""
    manifest = {
        "run_id": run_id,
        "status": "finished",
        "pair": {
            "name": "tiny",
            "target": "t",
            "drafter": "d",
            "method": "draft_model",
            "max_k": 3,
        },
        "sweep": {
            "name": "s",
            "workloads": list(workloads),
            "sampling": sampling or {"temperature": 0.0},
        },
        "arms": [
            {
                "name": a,
                "kind": a.split("-")[0],
                "k": int(a[-1]) if a[-1].isdigit() else 0,
                "supported": not (av_unsupported and a.startswith("av")),
                "unsupported_reason": "av-k3: the CPU build runs Model Runner V1 <no AV>"
                if av_unsupported and a.startswith("av")
                else None,
            }
            for a in arms
        ],
    }
    store = RunStore.create(root, run_id, manifest)
    for rep in range(repeats):
        for arm in arms:
            if av_unsupported and arm.startswith("av"):
                continue
            k = int(arm[-1]) if arm[-1].isdigit() else 0
            for w in workloads:
                loads = [(c, None) for c in concurrencies] + [(None, r) for r in rates]
                for conc, rate in loads:
                    c = conc or rate  # an open-loop rate stands in for the load's size
                    load = f"c{conc}" if rate is None else f"r{rate:g}"
                    g = GAIN[arm] * (1.4 if arm == "static-k1" and c == 16 else 1.0)
                    y = 100 * c**0.8 * g * (1 + 0.02 * rep)
                    row = {
                        "cell_id": f"{arm}__{w}__{load}__rep{rep}",
                        "arm": arm,
                        "arm_kind": arm.split("-")[0],
                        "k": k,
                        "pair": "tiny",
                        "workload": w,
                        "concurrency": conc,
                        "rate": rate,
                        "repeat": rep,
                        "output_tok_s_per_gpu": y,
                        "interactivity_tok_s_user": y / c,
                        "tpot_ms_median": 1000 * c / y,
                        "ttft_ms_median": 20.0,
                        "acceptance_length": None if k == 0 else 1 + 0.5 * k,
                        "acceptance_rate": None if k == 0 else 0.5,
                        "num_drafts": None if k == 0 else 100.0,
                        "num_draft_tokens": None if k == 0 else 100.0 * k,
                        "speculative_config": None
                        if k == 0
                        else {"method": "draft_model", "num_speculative_tokens": k},
                        **{f"accept_pos_{i}": 0.6 / (i + 1) for i in range(k)},
                    }
                    row |= (engine or {}).get(arm, {})
                    if av_captured and arm.startswith("av"):  # AV trimmed 1 draft in 4
                        row |= {"verified_acceptance_rate": 0.7, "trimmed_share": 0.25,
                                "verified_tokens_per_draft": 2.25}  # fmt: skip
                    records = [
                        RequestRecord(
                            conversation_id=str(i),
                            turn=0,
                            ttft=0.02 + 0.001 * i,
                            e2e=0.5 + 0.01 * i,
                            completion_tokens=50,
                        )
                        for i in range(8)
                    ]
                    store.write_cell(row, records, {})
    return store


def write_refits(store: RunStore, arm: str, n: int = 5) -> None:
    """Refit lines as the plugin writes them, timed inside the arm's cells."""
    cells = [r for r in store.finished_cells().values() if r["arm"] == arm]
    t0 = min(datetime.fromisoformat(r["finished_at"]).timestamp() for r in cells) - 0.5
    folder = store.arm_dir(arm) / "capture"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        {
            "time": t0 + 0.01 * i,
            "pid": 1,
            "refit_index": i,
            "step_count": 100 * (i + 1),
            "slope": 0.5 + 0.01 * i,
            "intercepts": [0.4 - 0.02 * i, 0.1, -0.2],
            "label_counts": [10, 8, 6],
        }
        for i in range(n)
    ]
    (folder / "refits.1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.fixture
def run_factory():
    return make_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    store = make_run(tmp_path / "results")
    for cell_id, reason in (
        ("static-k1__gsm8k__c1__rep0", "finished by resume"),
        ("static-k1__gsm8k__c64__rep0", "server died\nlog"),
    ):
        store.write_failure(CellFailure(cell_id=cell_id, reason=reason, kind="server_died"))
    write_refits(store, "av-k3")
    return store.root
