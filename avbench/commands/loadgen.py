"""`avbench serve-fake`: the local fake streaming server, for trying the client without vLLM."""

from __future__ import annotations

import typer

_MAX_DELAY_MS = 3_600_000.0  # an hour: past it a delay is a typo


def serve_fake(
    port: int = typer.Option(8000, help="Port to listen on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    tokens_per_chunk: int = typer.Option(3, min=1, max=1 << 20, help="Tokens in each chunk."),
    inter_chunk_ms: float = typer.Option(
        0.0, min=0, max=_MAX_DELAY_MS, help="Delay between chunks (ms)."
    ),
    first_token_ms: float = typer.Option(
        0.0, min=0, max=_MAX_DELAY_MS, help="Delay before the first chunk (ms)."
    ),
    model: str = typer.Option("fake-model", help="Model name the server reports."),
) -> None:
    """Serve the fake OpenAI-style streaming server (tests/benchmarks only) until Ctrl-C."""
    import dataclasses
    import errno
    import json

    from avbench.errors import AvbenchError
    from avbench.inputs.checks import check_port
    from avbench.serving.server import port_holder
    from avbench.serving.stream_server import ServerConfig, main

    if port != 0:
        check_port(port)
    cfg = ServerConfig(
        model=model,
        tokens_per_chunk=tokens_per_chunk,
        inter_chunk_delay_s=inter_chunk_ms / 1e3,
        first_token_delay_s=first_token_ms / 1e3,
        record=False,
    )
    args = [
        "--host",
        host,
        "--port",
        str(port),
        "--config-json",
        json.dumps(dataclasses.asdict(cfg)),
    ]
    try:
        main(args)
    except OSError as exc:  # bind: a busy port, an address this host does not have
        if exc.errno == errno.EADDRINUSE:
            holder = port_holder(port)
            who = f" by pid {holder[0]} ({holder[1][:120]})" if holder else ""
            raise AvbenchError(
                f"--port {port}: already in use on {host}{who}; pass another --port (0: any)"
            ) from None
        raise AvbenchError(
            f"--host {host} --port {port}: cannot listen ({exc.strerror or exc})"
        ) from None


def register(app: typer.Typer) -> None:
    app.command("serve-fake")(serve_fake)
