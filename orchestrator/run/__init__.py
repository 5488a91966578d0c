"""One run of any algorithm: the shared loop (trainer), what it holds (state), validation, checkpoints,
recovery; the rollout fleet between steps, healed and resized (fleet); the check that the rollout samples
from the actor's weights (parity); and Ctrl-C's way out, said at once and bounded in time (interrupt)."""
