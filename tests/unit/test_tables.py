"""A choice's names and the table that acts on them agree, where the two sit on either side of the import
rule (meshrl/config names a choice for every side; the service that acts on it holds the table): the
actor's engines, the weight transports' senders, the routing replay modes."""

from meshrl.config.actor import ENGINE_NAMES
from meshrl.config.losses import REPLAYS, ROUTER_REPLAY
from meshrl.config.rollout import TRANSPORTS
from meshrl.weights import SENDERS
from services.actor.engine import ENGINES


def test_every_engine_name_has_its_engine():
    assert set(ENGINES) == set(ENGINE_NAMES)


def test_every_transport_has_its_sender():
    assert set(SENDERS) == set(TRANSPORTS)


def test_every_replay_mode_is_one_row_of_its_table():
    assert ROUTER_REPLAY == tuple(REPLAYS) and [r.name for r in REPLAYS.values()] == list(REPLAYS)
    assert [name for name, r in REPLAYS.items() if r.afresh] == ["off"]
