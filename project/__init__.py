"""Example Django project that runs emq-django (see README.md)."""
