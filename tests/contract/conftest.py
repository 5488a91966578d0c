"""Fixtures the contract files share: the actor service's two ranks and an HF rollout in this process, each
started once per test file. A file sets ACTOR_FLAGS for its actor's own settings (a learning rate, an
adapter); the helpers the fixtures are built from are in actor_process.py and calls.py."""

import pytest
from actor_process import Service
from calls import serve


@pytest.fixture(scope="module")
def actor(request, tiny_lm):
    """`meshrl serve actor` with two ranks on the tiny model and the file's ACTOR_FLAGS."""
    flags = getattr(request.module, "ACTOR_FLAGS", ())
    s = Service("--role", "actor", "--model", str(tiny_lm), "--world-size", "2", *flags)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def rollout(tiny_lm):
    """A client of an HF rollout on the tiny model (max_model_len 64), served in this process."""
    servicer, server, client = serve(tiny_lm)
    with client:
        yield client
    server.stop(0)
    servicer.close()
