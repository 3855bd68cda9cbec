"""Load driver: async streaming requests against an OpenAI-compatible server."""
