"""One log line per distinct fallback and process: a kernel falls back for a property of its inputs' layout or of the
build (slot alignment, a Triton version, a failed Gluon compile), which every later call shares."""
import functools
import logging


@functools.lru_cache(maxsize=None)
def log_once(logger: logging.Logger, level: int, message: str) -> None:
    """logger.log(level, message) the first time this (logger, level, message) comes; later calls say nothing
    (`log_once.cache_clear()` forgets them, e.g. between tests)."""
    logger.log(level, message)
