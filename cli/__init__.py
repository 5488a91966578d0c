"""The `meshrl` command (cli.main): the entry point above everything, the one package that imports
meshrl, services and the orchestrator alike. `python -m cli ...` is the same command."""
