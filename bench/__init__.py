"""Benchmarks: durable jobs against plain Dramatiq and Celery, on real servers.

Run ``python -m bench all --quick`` from the repository root; see bench/README.md.
"""
