"""Measurement: the benchmark and sweep suites, the results writer, statistics and the summary.

The product packages never import this one."""
