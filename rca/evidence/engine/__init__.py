"""The running engine: launching it, reading its speculative-decoding counters, and serving a fix."""
