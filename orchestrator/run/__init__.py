"""One run of any algorithm: the shared loop (trainer), what it holds (state), validation, checkpoints,
recovery."""
