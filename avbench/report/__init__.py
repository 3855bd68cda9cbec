"""The report of one or several runs: the answer page, its Markdown summary and figures."""

from avbench.report.page import ReportFiles, write_report

__all__ = ["ReportFiles", "write_report"]
