"""Benchmarks: emq against Celery, Dramatiq and a raw ZeroMQ reference."""
