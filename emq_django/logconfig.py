"""Logging set-up for the long-running commands (never at import time)."""

from __future__ import annotations

import logging


def configure_command_logging(verbosity: int = 1) -> None:
    """Send emq_django's logs to stderr, unless the project's LOGGING already does."""
    logger = logging.getLogger("emq_django")
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity >= 1 else logging.WARNING
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
