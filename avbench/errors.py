"""User-facing errors: each prints as one line naming the cause."""


class AvbenchError(Exception):
    """Base for errors the CLI prints as a single line (no traceback)."""


class SuiteError(AvbenchError):
    """A suite file is malformed or names something unknown."""


class WorkloadError(AvbenchError):
    """A workload cannot be loaded (missing data, placeholder rows, bad schema)."""


class ServerError(AvbenchError):
    """A vLLM server could not be started, became unready or was unsupported."""


class UnsupportedArm(ServerError):
    """The installed vLLM cannot run this arm (e.g. AV on the CPU build)."""
