"""avbench's prefix-reset route as vLLM installs it (``--middleware``: an HTTP middleware on
vLLM's FastAPI app). ``_Engine`` stands in for vLLM's AsyncLLM: the route calls its
``reset_prefix_cache`` and answers what it returns."""

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from avbench.capture_protocol import PREFIX_RESET_PATH
from avbench.vllm_plugin.prefix_reset import prefix_reset_route


class _Engine:
    def __init__(self, success: bool):
        self.success, self.resets = success, 0

    async def reset_prefix_cache(self) -> bool:
        self.resets += 1
        return self.success


def _client(engine: _Engine) -> TestClient:
    app = FastAPI()
    app.state.engine_client = engine
    app.middleware("http")(prefix_reset_route)

    @app.post("/v1/completions")
    async def completions():
        return {"served": True}

    return TestClient(app)


@pytest.mark.parametrize("success", [True, False])
def test_a_post_resets_the_engines_prefix_cache_and_says_whether_it_did(monkeypatch, success):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    engine = _Engine(success)
    r = _client(engine).post(PREFIX_RESET_PATH)
    assert r.status_code == 200 and r.json() == {"success": success}
    assert engine.resets == 1


def test_it_wants_the_servers_api_key(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-prefix-9")
    engine = _Engine(True)
    client = _client(engine)
    assert client.post(PREFIX_RESET_PATH).status_code == 401
    wrong = {"Authorization": "Bearer sk-other"}
    assert client.post(PREFIX_RESET_PATH, headers=wrong).status_code == 401
    assert engine.resets == 0
    right = {"Authorization": "Bearer sk-prefix-9"}
    assert client.post(PREFIX_RESET_PATH, headers=right).json() == {"success": True}
    assert engine.resets == 1


def test_every_other_request_passes_on_untouched():
    engine = _Engine(True)
    client = _client(engine)
    assert client.post("/v1/completions").json() == {"served": True}
    assert client.get(PREFIX_RESET_PATH).status_code in (404, 405)
    assert engine.resets == 0
