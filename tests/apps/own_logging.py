"""An application that configures the standard library's logging itself."""

from __future__ import annotations

import logging

from taskq import TaskQ

logging.basicConfig(level=logging.INFO, format="APP %(levelname)s %(message)s")
logging.getLogger("app").info("configured its own logging")

tq = TaskQ("memory://")
