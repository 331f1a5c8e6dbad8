"""Repository-wide test configuration."""

import structlog

pytest_plugins = ["pytester"]

# Tests log through structlog's defaults, whose console tracebacks (rich, when installed)
# render every frame's locals: seconds per logged error on a loaded machine, enough to
# push a stop past its test's bound. Plain tracebacks, as `taskq.logs` renders them.
structlog.configure(
    processors=[
        *structlog.get_config()["processors"][:-1],
        structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback),
    ]
)
