"""The session's HTML report: one self-contained file (charts, their runtime and the table's
script inlined) that opens offline from a CI artifact. :func:`~pytest_qwenperf.report.html.write_report`
writes it; the pytest option ``--qwenperf-html`` and ``qwenperf report`` call it."""
