"""What a service's own command line (meshrl.flags, as `meshrl serve` adds a settings dataclass's flags)
reads from the arguments a run passes it: the unit tests of the run-service agreement check it."""

import argparse

from meshrl.flags import add_dataclass_flags, dataclass_from_args


def parsed(cls, args, skip=()):
    """What a service's own flags (meshrl.flags, as `meshrl serve` adds them) read from `args`."""
    p = argparse.ArgumentParser()
    add_dataclass_flags(p, cls, skip)
    return dataclass_from_args(cls, p.parse_known_args(args)[0], skip)
