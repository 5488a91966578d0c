"""What the tests and the benchmarks share: a stand-in reward service (echo), the command lines of small
runs and the self-healing run (runs), the tool task's learning recipe (tool_task) and a scripted rollout
backend in the model's tool format (scripted); a bundled task's recipe run in-process (recipe); batches in
verl's layout for the actor's passes (batches) and rows for its padding-free passes (packed); the tree's
type check and its early start (mypy_check); an OpenAI-compatible endpoint over a stand-in engine and an
agent that needs only the standard library (agent_endpoint); a tiny folder of any architecture transformers
registers (tiny_families) and its verdict in the family matrix (family_parity); the pinned venv of a hub
or an agent framework (venvs). Not installed with meshrl:
importable from the checkout's root, where pytest and bench/ run."""
