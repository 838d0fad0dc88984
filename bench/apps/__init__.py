"""Modules the benchmark's worker processes load; each reads its URLs from ``BENCH_*`` env vars."""
