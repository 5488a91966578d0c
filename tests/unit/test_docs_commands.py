"""The commands README.md and docs/*.md give (fenced shell blocks, and inline code that starts with a
command: `meshrl ...`, `bash scripts/...`, `.venv/bin/python bench/...`) name files that exist: a config,
script, example or benchmark a newcomer copies from the docs must be in the repository (issue 58: the MoE
section ran `--config configs/grpo.yaml`, which there never was)."""

import glob
import pathlib
import re
import shlex
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}  # fenced blocks read as commands; python, yaml, plain ones not
INLINE = re.compile(r"`((?:\.venv/bin/|\./)?(?:meshrl|python3?|bash|sh|uv|pytest|docker(?:-compose)?)\b[^`]*)`")
CREATED = (  # paths an earlier command or the run itself makes, not the repository's: not checked
    "runs/",  # run folders: trainer.run_dir, scripts/prepare.sh's runs/default, `meshrl export`'s output
    "models/",  # `meshrl make-model models/...`, run before the command that trains it
    "data/",  # `meshrl make-data data/...` and scripts/prepare.sh
    ".venv/",  # scripts/setup.sh's environment, which every command runs from
)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$|\.\.\.")  # FILE, RUN_DIR, data.train_files=...: the reader's to fill


def commands(text: str) -> Iterator[tuple[int, str]]:
    """(line, command) for each command in a markdown text: a fenced shell block's lines (backslash
    continuations joined) and inline code that starts with a command (it may wrap onto the next line)."""
    prose, fence, pending = [], None, ""
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            prose.append("")
            continue
        prose.append(line if fence is None else "")
        if fence in SHELLS:
            pending += line[:-1] + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                yield n, " ".join(pending.split())
                pending = ""
    joined = "\n".join(prose)
    for m in INLINE.finditer(joined):
        yield joined.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())


def named(command: str) -> list[str]:
    """The repository paths a command names: words (or key=value's values) under one of the repository's
    folders, and what follows --config or -f; placeholders and CREATED paths left out."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote: its words as they stand
        words = command.split()
    out = []
    for i, word in enumerate(words):
        value = word.split("=", 1)[1] if "=" in word else word
        value = re.sub(r"(\.py):\w+$", r"\1", value.removeprefix("./"))  # path/to/file.py:function
        if PLACEHOLDER.search(value) or value.startswith(CREATED) or not value:
            continue
        top = value.split("/", 1)[0]
        in_repository = "/" in value and top and not top.startswith(".") and (ROOT / top).is_dir()
        if in_repository or i and words[i - 1] in ("--config", "-f"):
            out.append(value)
    return out


def missing(doc: pathlib.Path, text: str) -> list[str]:
    return [
        f"{doc.relative_to(ROOT)}:{n}: {path} (in `{command[:72]}`)"
        for n, command in commands(text)
        for path in named(command)
        if not glob.glob(str(ROOT / path))
    ]


def test_every_file_a_doc_command_names_exists():
    gone = [line for doc in DOCS for line in missing(doc, doc.read_text())]
    assert not gone, "files the docs' commands name that are not in the repository:\n" + "\n".join(gone)


def test_the_reader_finds_commands_and_their_paths():
    doc = ROOT / "docs" / "example.md"
    text = """Run `bash scripts/run.sh
trainer.total_steps=9` or:

```bash
.venv/bin/meshrl make-model models/tiny-moe   # made here: not checked
.venv/bin/meshrl grpo --config configs/nothing.yaml \\
    actor.model=models/tiny-moe data.train_files=data/a/train.parquet trainer.run_dir=runs/x
.venv/bin/python bench/no_bench.py --out FILE
```

```python
open("configs/not_a_command.yaml")
```
"""
    found = list(commands(text))
    assert (1, "bash scripts/run.sh trainer.total_steps=9") in found
    grpo = next(command for _, command in found if " grpo " in command)
    assert named(grpo) == ["configs/nothing.yaml"]  # models/, data/, runs/: made by the commands
    assert missing(doc, text) == [
        "docs/example.md:7: configs/nothing.yaml (in `.venv/bin/meshrl grpo --config configs/nothing.yaml "
        "actor.model=models/t`)",
        "docs/example.md:8: bench/no_bench.py (in `.venv/bin/python bench/no_bench.py --out FILE`)",
    ]
