"""Drafts capture: state shared by the Model Runner V1 and V2 hooks of one worker process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from avbench.vllm_plugin.ids import client_request_id, is_sampled
from avbench.vllm_plugin.runtime import Health

if TYPE_CHECKING:
    from avbench.vllm_plugin.sink import ShardWriter


class DraftCapture:
    """One per process. Counts engine steps, decides which requests are sampled, and hands
    proposals and verdicts to the background writer (started on first use)."""

    def __init__(self, capture_dir: Path, fraction: float, health: Health):
        self.dir = capture_dir
        self.fraction = fraction
        self.health = health
        self.enabled = True
        self.step = 0  # engine steps that scheduled work, counted in this worker
        self.step_spec: dict = {}  # request -> drafts scheduled for verification this step
        self.current = None  # the V1 proposal being drafted
        # (num_sampled, num_rejected) of this step, Model Runner V2
        self.v2_verdict: tuple[Any, Any] | None = None
        # Model Runner V2: vLLM's estimator module that computes our logit(q_max) (None: its
        # kernels on a GPU, the numpy transcription on CPU), and whether they were compiled.
        self.kernels = None
        self.primed = False
        self._ids: dict[str, str | None] = {}  # engine id -> client id if sampled, else None
        self._writer: ShardWriter | None = None
        self._rank: tuple[bool, int] | None = None

    def disable(self, why: str) -> None:
        self.enabled = False
        self.health.mismatch(why)

    def captures_here(self) -> bool:
        """Only the first tensor-parallel rank of the last pipeline stage writes (the others
        hold the same drafts); every data-parallel rank writes its own requests."""
        if self._rank is None:
            first, dp = True, 0
            try:
                from vllm.distributed.parallel_state import get_pp_group, get_tp_group

                first = get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank
            except Exception:  # noqa: BLE001 - no distributed state: a single process
                pass
            try:
                from vllm.distributed.parallel_state import get_dp_group

                dp = int(get_dp_group().rank_in_group)
            except Exception:  # noqa: BLE001
                pass
            self._rank = (first, dp)
        return self._rank[0]

    def sampled_ids(self, engine_ids: list[str]) -> list[str]:
        """The client ids of requests chosen for capture (each one's ``client_id`` is set)."""
        return [cid for e in engine_ids if (cid := self.client_id(e)) is not None]

    def client_id(self, engine_id: str) -> str | None:
        """The client's id when this request is sampled, else None (cached per request)."""
        cid = self._ids.get(engine_id, "")
        if cid == "":
            c = client_request_id(engine_id)
            cid = c if is_sampled(c, self.fraction) else None
            self._ids[engine_id] = cid
        return cid

    def finished(self, engine_ids) -> None:
        done = [e for e in engine_ids if self._ids.pop(e, None)]
        if done:
            self.submit(done)

    def submit(self, item) -> None:
        if self._writer is None:
            from avbench.vllm_plugin.sink import ShardWriter

            self.captures_here()
            assert self._rank is not None
            self._writer = ShardWriter(self.dir, self.health, dp_rank=self._rank[1])
        self._writer.submit(item)

    @staticmethod
    def now() -> float:
        return time.time()
