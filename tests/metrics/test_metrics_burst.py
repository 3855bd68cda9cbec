from avbench.loadgen.records import RequestRecord
from avbench.metrics import compute_cell_metrics


def _rec(i, times):
    return RequestRecord(
        conversation_id=f"c/{i}",
        turn=0,
        sent_at=0.0,
        ttft=times[0],
        e2e=times[-1],
        chunk_times=list(times),
        chunk_tokens=[1] * len(times),
        completion_tokens=len(times),
    )


def test_burst_fraction_flags_streams_delivered_in_one_piece():
    spread = [0.01, 0.02, 0.03, 0.04]
    burst = [0.2, 0.2, 0.2, 0.2]
    short = [0.2, 0.2]  # too few chunks to judge: left out
    recs = [_rec(0, spread), _rec(1, burst), _rec(2, burst), _rec(3, spread), _rec(4, short)]
    m = compute_cell_metrics(recs, window_s=1.0, gpus=1, counters_before=None, counters_after=None)
    assert m.values["stream_burst_frac"] == 0.5
    assert "one burst" in m.definitions()["stream_burst_frac"].definition
