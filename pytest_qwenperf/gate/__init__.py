"""Judging results: the baseline store, verdicts on whole runs and the comparison of result
files. Imports only core, so comparing two files loads no server or load-generator code."""
