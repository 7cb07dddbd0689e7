"""The daemon's own log: one destination, one format, one verbosity scale for every logger.

`megnode run` logs to stderr, or with `--log-file F` to a size-rotated file.
Every logger in the process goes there in the node's format: the node's own
(`megnode.*`) and every library's. py-libp2p needs undoing: importing it
configures its `libp2p` logger itself (no handlers, `propagate = False`, or
with LIBP2P_DEBUG its own stderr and temp-file handlers), so its warnings went
through Python's last-resort handler to stderr whatever `--log-file` said.
Python's `warnings` are logged too (`py.warnings`), so a library's
DeprecationWarning does not land on stderr either.

Verbosity (`-v` counted), the same scale for every logger:

    (none)  warnings and errors of everyone
    -v      + the node's info lines (started, peers, joins)
    -vv     + the node's debug lines and the libraries' info lines
    -vvv    everything, libraries' debug lines included

The scale is applied by the handler (VerbosityFilter), not by the loggers'
own levels: a library that sets its logger's level in code (py-libp2p's
auto-connector forces INFO) or is imported later cannot bypass it. LIBP2P_DEBUG
is not needed (`-vvv` shows py-libp2p's debug lines): if set, py-libp2p still
creates its temp file on import, but its handlers and queue listener are
removed here, so its lines go to the node's log at the `-v` levels.
"""

from __future__ import annotations

import logging
import sys
from enum import IntEnum
from logging.handlers import RotatingFileHandler

DAEMON_LOG_MAX_BYTES = 10 * 1024 * 1024  # `run --log-file`: rotated at this size
DAEMON_LOG_BACKUPS = 5  # rotated files kept beside the current one
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NODE_LOGGER = "megnode"
# Loggers that configure themselves on import; reset after importing them.
SELF_CONFIGURING_LIBRARIES = ("libp2p",)


class Verbosity(IntEnum):
    """`-v` counted: each step opens the node's next level, then the libraries'."""

    QUIET = 0
    INFO = 1
    DEBUG = 2
    ALL = 3


def levels(verbosity: int) -> tuple[int, int]:
    """(the node's level, the libraries' level) for a `-v` count (clamped to 0..3)."""
    step = Verbosity(max(Verbosity.QUIET, min(verbosity, Verbosity.ALL)))
    return {
        Verbosity.QUIET: (logging.WARNING, logging.WARNING),
        Verbosity.INFO: (logging.INFO, logging.WARNING),
        Verbosity.DEBUG: (logging.DEBUG, logging.INFO),
        Verbosity.ALL: (logging.DEBUG, logging.DEBUG),
    }[step]


class LogFileError(Exception):
    """The log file cannot be opened (the message names it and why)."""


def setup_daemon_log(path: str | None, verbosity: int) -> logging.Handler:
    """Send every logger of this process to stderr or the rotated file `path`.

    Returns the handler (a test or an embedding program may remove it again).
    """
    handler: logging.Handler
    if path is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        try:
            handler = RotatingFileHandler(path, maxBytes=DAEMON_LOG_MAX_BYTES,
                                          backupCount=DAEMON_LOG_BACKUPS, encoding="utf-8")
        except OSError as exc:
            raise LogFileError(f"cannot write the log file {path}: {exc.strerror or exc}") from None
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    node_level, library_level = levels(verbosity)
    handler.addFilter(VerbosityFilter(node_level, library_level))
    for name in SELF_CONFIGURING_LIBRARIES:
        _import_quietly(name)  # so its own set-up runs now, not after ours
    _stop_libp2p_listener()
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(min(node_level, library_level))
    _route_every_logger_to_root()
    logging.captureWarnings(True)
    return handler


class VerbosityFilter(logging.Filter):
    """Passes the node's records from `node_level` on, everyone else's from `library_level`."""

    def __init__(self, node_level: int, library_level: int) -> None:
        super().__init__()
        self.node_level = node_level
        self.library_level = library_level

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name == NODE_LOGGER or record.name.startswith(NODE_LOGGER + ".")
        return record.levelno >= (self.node_level if ours else self.library_level)


def _import_quietly(name: str) -> None:
    try:
        __import__(name)
    except ImportError:  # not installed here: nothing of it to reset
        pass


def _route_every_logger_to_root() -> None:
    """Every logger hands its records to the root's handler, levels left to the filter."""
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):
            continue  # a placeholder: no records of its own
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def _stop_libp2p_listener() -> None:
    """With LIBP2P_DEBUG set, py-libp2p runs a queue listener writing to its own files."""
    module = sys.modules.get("libp2p.utils.logging")
    cleanup = getattr(module, "cleanup_logging", None)
    if cleanup is not None:
        cleanup()
