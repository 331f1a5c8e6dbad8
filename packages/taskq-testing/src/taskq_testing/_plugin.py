"""taskq-testing's registration with TaskQ (entry point group `taskq`)."""
