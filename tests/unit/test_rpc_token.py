"""Where tokens come from (meshrl.rpc.token): the run's own token, and the one a service sends on its
own calls (the actor's weight push), which is never the run's token when the rollout is a stranger's."""

from meshrl.rpc import token


def test_a_peer_token_overrides_the_services_own_and_the_run_forgets_both(monkeypatch):
    monkeypatch.delenv(token.VAR, raising=False)
    monkeypatch.delenv(token.FILE_VAR, raising=False)
    monkeypatch.delenv(token.PEER_VAR, raising=False)
    assert token.run_token() and token.env_token() and token.peer_token() == token.env_token()
    monkeypatch.setenv(token.PEER_VAR, "")  # a rollout given by address: the push sends no token
    assert token.peer_token() == "" and token.env_token()
    token.forget_run_token()
    assert token.env_token() is None and token.peer_token() is None
    monkeypatch.setenv(token.VAR, "users")  # the user's own token is shared with every service
    assert not token.run_token() and token.peer_token() == "users"
