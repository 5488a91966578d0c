"""The OpenAI-compatible endpoint as a service of its own (`meshrl serve gateway`)."""
