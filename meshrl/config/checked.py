"""What every settings class shares: validation that composes, and errors that name the key.

A run section is several settings classes in one (the actor's is the engine's, the optimizer's and the
policy loss's), so each class checks its own fields in __post_init__ and hands on to the next
(cooperative super()), and the root checks that every number is finite. An error names its keys as
`{key}` in a template: a service shows the plain name (`lr=-1.0 must be > 0`), meshrl.typed.build the
section's dotted key (`actor.lr=-1.0 must be > 0`), so one check reads right on either side.
"""

import dataclasses
import math
import re


class FieldError(ValueError):
    """A setting that does not fit; the template writes each key it names as {key}."""

    def __init__(self, template: str):
        self.template = template
        super().__init__(self.named(""))

    def named(self, where: str) -> str:
        return re.sub(r"\{(\w+)\}", lambda m: f"{where}.{m.group(1)}" if where else m.group(1), self.template)


def shown(value) -> str:
    """A value as the user wrote it in YAML or on a command line: true, null, 0.5."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def require(ok: bool, obj, key: str, rule: str) -> None:
    """FieldError `{key}=value rule` unless ok."""
    if not ok:
        raise FieldError(f"{{{key}}}={shown(getattr(obj, key))} {rule}")


def one_of(obj, key: str, options) -> None:
    require(getattr(obj, key) in options, obj, key, f"must be one of {tuple(options)}")


def values_of(cls, obj) -> dict:
    """{field of cls: obj's value}: the part of a composed section that one settings class holds."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)}


@dataclasses.dataclass
class Checked:
    """The root of the settings classes: every float finite (a NaN coefficient would train on NaN silently)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            require(not isinstance(v, float) or math.isfinite(v), self, f.name, "must be a finite number")
