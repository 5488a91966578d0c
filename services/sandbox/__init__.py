"""The sandbox service: programs a policy wrote, run where they can do no harm.

- bwrap: one program in a bubblewrap sandbox (isolation, limits, files in and out, capped output).
- cgroups: a cgroup per sandbox (its memory as a whole, its processes), where the machine allows.
- warm: sandboxes started ahead of their Runs, each waiting for one program, and the pool that keeps them.
- reaper: the service waits for its sandboxes' orphaned last processes itself.
- servicer: the SandboxService (slots, each its own user; sessions that keep files across Runs).
- main: `meshrl serve sandbox`.
"""
