from avbench.vllm_plugin.ids import client_request_id, is_sampled


def test_engine_ids_map_back_to_the_response_id():
    assert client_request_id("cmpl-9559d0b0c06080da-0-a63bc5b7") == "cmpl-9559d0b0c06080da"
    assert client_request_id("chatcmpl-abc123-1f2e3d4c") == "chatcmpl-abc123"
    assert client_request_id("chatcmpl-abc123_2-1f2e3d4c") == "chatcmpl-abc123"
    # parallel sampling (n > 1): the child index goes in front of the parent's engine id
    assert client_request_id("3_cmpl-abc-0-1f2e3d4c") == "cmpl-abc"
    # an X-Request-Id header becomes the base of the id
    assert client_request_id("cmpl-my-run-17-0-0123abcd") == "cmpl-my-run-17"
    assert client_request_id("cmpl-abc-0", randomized=False) == "cmpl-abc"


def test_sampling_is_deterministic_and_close_to_the_fraction():
    ids = [f"cmpl-{i:016x}" for i in range(4000)]
    picked = [i for i in ids if is_sampled(i, 0.25)]
    assert picked == [i for i in ids if is_sampled(i, 0.25)]
    assert 0.22 < len(picked) / len(ids) < 0.28
    assert all(is_sampled(i, 1.0) for i in ids[:10]) and not any(is_sampled(i, 0) for i in ids)


def test_randomisation_switch_is_read_as_vllm_reads_it(monkeypatch):
    """vLLM parses VLLM_DISABLE_REQUEST_ID_RANDOMIZATION with bool(int(v)): "0" keeps the
    8-hex suffix, which must then be stripped; "1" drops it."""
    engine_id = "cmpl-abc-0-1f2e3d4c"
    for value, want in (("0", "cmpl-abc"), ("1", "cmpl-abc-0-1f2e3d4c"), ("", "cmpl-abc")):
        monkeypatch.setenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", value)
        assert client_request_id(engine_id) == want, value
    monkeypatch.delenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION")
    assert client_request_id(engine_id) == "cmpl-abc"
