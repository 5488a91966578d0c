"""Agents written against the OpenAI API, played as episodes (rollout.agent, rollout.agent_command)."""
