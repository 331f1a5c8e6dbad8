"""taskq-otel's registration with TaskQ (entry point group `taskq`)."""
