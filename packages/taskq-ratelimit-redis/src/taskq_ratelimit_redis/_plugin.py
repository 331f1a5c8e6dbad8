"""taskq-ratelimit-redis's registration with TaskQ (entry point group `taskq`)."""
