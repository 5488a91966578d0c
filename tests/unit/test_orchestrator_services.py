"""orchestrator.lifecycle.services around a stand-in process: what a started service prints after its "listening on"
line is passed on, never left to fill a pipe nobody reads (its writes would block it mid-run)."""

import subprocess
import sys

from orchestrator.lifecycle.services import listening


def test_output_after_the_listening_line_is_drained(capfd):
    chatty = (
        "import sys; print('rollout service listening on 127.0.0.1:5', flush=True); "
        "[print('INFO engine step', i) for i in range(40000)]; print('the end')"
    )  # ~0.8 MB, 12x a pipe
    proc = subprocess.Popen([sys.executable, "-c", chatty], stdout=subprocess.PIPE, text=True)
    _, address = listening(proc, ["rollout"])
    assert address == "127.0.0.1:5"
    assert proc.wait(timeout=60) == 0  # it did not block on a full pipe
