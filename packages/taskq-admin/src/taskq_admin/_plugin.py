"""taskq-admin's registration with TaskQ (entry point group `taskq`)."""
