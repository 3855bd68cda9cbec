"""`avbench serve-fake`: the local fake streaming server, for trying the client without vLLM."""

from __future__ import annotations

import typer


def serve_fake(
    port: int = typer.Option(8000, help="Port to listen on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    tokens_per_chunk: int = typer.Option(3, min=1, help="Tokens in each streamed chunk."),
    inter_chunk_ms: float = typer.Option(0.0, min=0, help="Delay between chunks (ms)."),
    first_token_ms: float = typer.Option(0.0, min=0, help="Delay before the first chunk (ms)."),
    model: str = typer.Option("fake-model", help="Model name the server reports."),
) -> None:
    """Serve the fake OpenAI-style streaming server (tests/benchmarks only) until Ctrl-C."""
    import dataclasses
    import json

    from avbench.testing.stream_server import ServerConfig, main

    cfg = ServerConfig(
        model=model,
        tokens_per_chunk=tokens_per_chunk,
        inter_chunk_delay_s=inter_chunk_ms / 1e3,
        first_token_delay_s=first_token_ms / 1e3,
        record=False,
    )
    main(
        ["--host", host, "--port", str(port), "--config-json", json.dumps(dataclasses.asdict(cfg))]
    )


def register(app: typer.Typer) -> None:
    app.command("serve-fake")(serve_fake)
