"""CLI command groups. Each module exposes ``register(app)``; keep commands thin (parse, call)."""
