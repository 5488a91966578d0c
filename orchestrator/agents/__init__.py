"""Agents written against the OpenAI API, played as episodes (rollout.agent, rollout.agent_command).

- pool: where agents run: worker processes for a Python agent, or a process per episode for a command.
- worker: an agent worker process (standard library only, run by path): plays episodes, each on a thread.
- interpreter: the interpreter the workers run in, meshrl's own or the one rollout.agent_python names.
- command: rollout.agent_command, an agent in any language, one process per episode, killed at its timeout.
- sandbox: the sandbox behind a run's endpoint (rollout.agent_sandbox), for the agents' programs.
- episode: one agent episode on the run's endpoint, the endpoint's engine, and the run's agent runners.
- scores: what an episode scores from its agent's result, and a group scored together (score_group).
"""
