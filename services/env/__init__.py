"""The environment service: Python environments (one object per episode) behind EnvService."""
