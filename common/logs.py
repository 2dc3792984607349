"""The one log-line format every Biplane server writes: `key=value` fields after the time,
so a line can be grepped and parsed the same way whichever process wrote it."""
from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


def configure_logging(level_name: str) -> None:
    """Send structured lines at `level_name` (DEBUG, INFO, WARNING, ERROR) and above to stderr."""
    logging.basicConfig(level=getattr(logging, level_name), stream=sys.stderr, format=LOG_FORMAT)
