"""An application whose import waits for a line on stdin (as a large application's
imports take seconds), saying so first on stdout: a test's window into a worker before
its event loop runs."""

from __future__ import annotations

import sys

from taskq import TaskQ
from tests.apps.basic import nap

print("importing", flush=True)
sys.stdin.readline()

tq = TaskQ("memory://", actors=[nap])
