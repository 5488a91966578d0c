"""One run of any algorithm: the shared loop, checkpoints, recovery."""
