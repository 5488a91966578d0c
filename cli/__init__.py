"""The `meshrl` command (cli.main): the entry point above everything, the one package that imports
meshrl, services and the orchestrator alike. `python -m cli ...` is the same command (__main__).
The fork server's own process (forkserver) imports what every service needs once and forks each service
a run starts on this host; the caller's side is meshrl/forkserver.py."""
