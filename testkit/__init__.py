"""What the tests and the benchmarks share: a stand-in reward service (echo), the command lines of small
runs and the self-healing run (runs), the tool task's learning recipe (tool_task) and a scripted rollout
backend in the model's tool format (scripted). Not installed with meshrl: importable from the checkout's
root, where pytest and bench/ run."""
