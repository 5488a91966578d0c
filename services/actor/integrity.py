"""Checkpoint integrity: SaveCheckpoint signs what it wrote; LoadCheckpoint loads only what verifies.

Loading a DCP checkpoint unpickles its `.metadata`, so whoever can put files under
the checkpoint root could run code in the actor (a planted pickle did). The save
therefore writes, after every other file, `integrity.json`: each file's path
(relative, POSIX) and SHA-256, and an HMAC-SHA256 of that list under a key this
user alone holds. The load checks the HMAC, then that the folder holds exactly the
listed files, each with its digest, before any rank (any torch code) opens one; a
folder without a record, with a file altered, missing or added, or a symlink in
it, is refused.

The key, the first that is set:
- MESHRL_CHECKPOINT_KEY (a secret string in the environment): to share checkpoints
  between machines, users or containers, give every actor service the same value;
- the user's key file, $XDG_CONFIG_HOME/meshrl/checkpoint.key (default
  ~/.config/meshrl/checkpoint.key): 32 random bytes made at the first save, used
  only if it is a regular file of this user's that no one else may read or write.
Not the run token (MESHRL_TOKEN): a run makes a fresh one when none is set
(meshrl.rpc.token.run_token), so a resumed run could not verify the checkpoints of
the run it resumes, and services started by hand may have none at all. With the key
file they sign and verify all the same: a user's checkpoints load on the machine
that saved them, anything else is refused until signed. To adopt a folder you trust
(one saved before checkpoints were signed, or with another key), sign it:
`.venv/bin/python -m services.actor.integrity PATH`.

Not covered: someone who can write the folder between the check and DCP's own read
of the files (it reads them again), and anyone running as this user (who can read
the key). Hashing reads every file once more at save and at load.
"""

import hashlib
import hmac
import json
import os
import pathlib
import secrets
import stat
import sys

RECORD = "integrity.json"
_RECORD_TMP = f".{RECORD}.tmp"
KEY_VAR = "MESHRL_CHECKPOINT_KEY"
KEY_BYTES = 32
MAX_RECORD_BYTES = 16 << 20  # a record lists files, not data: more is not one of ours
_DOMAIN = b"meshrl-checkpoint-v1\0"  # what the MAC is of, so this key signs nothing else by accident


def checkpoint_key() -> bytes:
    """The signing key (see the module's docstring); ValueError if the key file is not safe to use."""
    if os.environ.get(KEY_VAR):
        return os.environ[KEY_VAR].encode()
    return _user_key(key_path())


def key_path() -> pathlib.Path:
    return (
        pathlib.Path(os.environ.get("XDG_CONFIG_HOME") or pathlib.Path.home() / ".config") / "meshrl" / "checkpoint.key"
    )


def _user_key(path: pathlib.Path) -> bytes:
    if not path.exists():
        _make_key(path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != KEY_BYTES:
            raise ValueError(
                f"checkpoint key file {path} is not a {KEY_BYTES}-byte file of this user's that only "
                f"they may read (mode 600); fix or remove it, or set {KEY_VAR}"
            )
        return os.read(fd, KEY_BYTES)
    finally:
        os.close(fd)


def _make_key(path: pathlib.Path) -> None:
    """Write the key whole under a temporary name, then link it into place: two services starting at once
    end up with one key, and neither reads a half-written file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:  # another service made it first: theirs it is
        pass
    finally:
        tmp.unlink()


def listing(folder: pathlib.Path) -> list[str]:
    """Relative POSIX paths of every file under folder; ValueError for a symlink or anything but a regular
    file (a save never makes one, and following it would read outside the checkpoint)."""
    files = []
    for here, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = pathlib.Path(here, name)
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            rel = path.relative_to(folder).as_posix()
            if not stat.S_ISREG(mode):
                raise ValueError(f"{rel} is not a regular file (a symlink?)")
            files.append(rel)
    return sorted(files)


def snapshot(folder: pathlib.Path) -> dict[str, tuple[int, int, int]]:
    """What is in folder before a save: (inode, ctime, size) per file, so `sign` can tell what the save wrote."""
    if not folder.is_dir():
        return {}
    return {rel: _identity(folder / rel) for rel in listing(folder)}


def sign(folder: pathlib.Path, before: dict[str, tuple[int, int, int]], key: bytes) -> None:
    """Write folder's integrity record over the files the save wrote (those not as `before` saw them). A file
    the save left untouched would be signed unread, so it is a ValueError instead (save into an empty
    folder). Written last, and atomically: a half-saved checkpoint has no record."""
    written = [rel for rel in listing(folder) if rel not in (RECORD, _RECORD_TMP)]
    stale = [rel for rel in written if before.get(rel) == _identity(folder / rel)]
    if stale:
        raise ValueError(
            f"{folder} holds {len(stale)} file(s) this save did not write, e.g. {stale[:3]}: save "
            "into an empty folder, or remove them"
        )
    files = {rel: _digest(folder / rel) for rel in written}
    tmp = folder / _RECORD_TMP
    tmp.write_text(json.dumps({"version": 1, "files": files, "mac": _mac(key, files)}, indent=1))
    os.replace(tmp, folder / RECORD)


def verify(folder: pathlib.Path, key: bytes) -> None:
    """ValueError unless folder holds exactly the files its record lists, each as it was saved, and the
    record is signed with `key`. Reads files as bytes only (hashlib): nothing in them runs."""
    files, mac = _read_record(folder)
    if not hmac.compare_digest(_mac(key, files).encode(), mac.encode()):
        raise ValueError(
            f"its integrity record is not signed with this service's checkpoint key ({KEY_VAR}, or "
            f"{key_path()}): saved with another key, or altered"
        )
    present = [rel for rel in listing(folder) if rel != RECORD]
    extra = [rel for rel in present if rel not in files]
    if extra:
        raise ValueError(f"{extra[0]} is not in its integrity record (added after the save)")
    missing = sorted(set(files) - set(present))
    if missing:
        raise ValueError(f"{missing[0]} is in its integrity record but missing")
    for rel in present:
        if not hmac.compare_digest(_digest(folder / rel).encode(), files[rel].encode()):
            raise ValueError(f"{rel} was altered after the save (its SHA-256 is not the record's)")


def _read_record(folder: pathlib.Path) -> tuple[dict[str, str], str]:
    """The record's files (path -> SHA-256) and its MAC, checked for shape only."""
    path = folder / RECORD
    if not path.is_file() or path.is_symlink():
        raise ValueError(
            f"no integrity record ({RECORD}): not saved by a meshrl actor service, or saved before "
            "checkpoints were signed (sign one you trust: python -m services.actor.integrity PATH)"
        )
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise ValueError(f"{RECORD} is over {MAX_RECORD_BYTES >> 20} MiB")
    try:
        record = json.loads(path.read_text())
        files, mac = record["files"], record["mac"]
        ok = (
            isinstance(files, dict)
            and isinstance(mac, str)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
        )
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise ValueError(f"{RECORD} is not an integrity record")
    return files, mac


def _identity(path: pathlib.Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_ino, st.st_ctime_ns, st.st_size


def _digest(path: pathlib.Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _mac(key: bytes, files: dict[str, str]) -> str:
    body = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, _DOMAIN + body, hashlib.sha256).hexdigest()


def main(argv: list[str]) -> int:
    """Sign checkpoint folders you trust with this user's key: python -m services.actor.integrity PATH..."""
    if not argv:
        print(main.__doc__, file=sys.stderr)
        return 2
    key = checkpoint_key()
    for folder in argv:
        sign(pathlib.Path(folder), {}, key)
        print(f"signed {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
