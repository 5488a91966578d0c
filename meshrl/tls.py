"""Mutual TLS between the mesh's roles, and who may call what.

`meshrl certs DIR` makes a private CA and one certificate per role (orchestrator, actor, rollout,
reward), each naming its role as common name and as a DNS name. With MESHRL_TLS_DIR=DIR in the
environment (never on a command line), every server presents its role's certificate and requires one
signed by the same CA from each caller; every client presents the certificate of the role its
process plays and accepts only a server whose certificate names the role it meant to reach (a
stand-in rollout with another role's certificate receives no weights).

The caller's role is then known, and PERMISSION_DENIED guards the privileged methods (POLICY): only
the orchestrator trains, checkpoints, generates and scores; only an actor changes a rollout's
weights (another rollout may only pass on the buckets of an update the actor began: a chained
push). Health checks, reflection and Describe answer any caller with a certificate from the CA.
Without MESHRL_TLS_DIR nothing changes: plain TCP, with the bearer token (meshrl.rpc.token) if set.
"""

import datetime
import ipaddress
import os
import pathlib
from collections.abc import Mapping
from typing import cast

import grpc

VAR = "MESHRL_TLS_DIR"
ROLES = ("orchestrator", "actor", "rollout", "reward", "env")
SERVER_ROLE = {"ActorService": "actor", "RolloutService": "rollout", "RewardService": "reward", "EnvService": "env"}
ANY_NAME = "meshrl"  # every certificate carries it: what `meshrl health` checks against

# method -> roles that may call it; methods not named here are open to any role of the mesh.
POLICY = {
    **{
        f"/meshrl.v1.ActorService/{m}": {"orchestrator"}
        for m in (
            "Init",
            "ComputeLogProbs",
            "ComputeValues",
            "Update",
            "SaveCheckpoint",
            "LoadCheckpoint",
            "PushWeights",
            "Offload",
            "Reload",
        )
    },
    **{f"/meshrl.v1.RolloutService/{m}": {"orchestrator"} for m in ("Generate", "Sleep", "WakeUp")},
    **{f"/meshrl.v1.RolloutService/{m}": {"actor"} for m in ("BeginWeightUpdate", "FinishWeightUpdate")},
    # a rollout passes a chained push's buckets on (services/rollout/relay.py), into an update the actor began
    "/meshrl.v1.RolloutService/SendWeights": {"actor", "rollout"},
    "/meshrl.v1.RewardService/Score": {"orchestrator"},
    **{f"/meshrl.v1.EnvService/{m}": {"orchestrator"} for m in ("Reset", "Step", "Close")},
}

_role = "orchestrator"  # the role this process calls as; a service sets its own when it starts


def set_role(role: str) -> None:
    global _role
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    _role = role


def enabled() -> bool:
    return bool(os.environ.get(VAR))


def credentials(role: str) -> tuple[bytes, bytes, bytes]:
    """(CA, key, certificate) of `role` from MESHRL_TLS_DIR, or a ValueError naming what is missing."""
    path = os.environ[VAR]
    folder = pathlib.Path(path)
    missing = [n for n in ("ca.pem", f"{role}.pem", f"{role}.key") if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"{VAR}={path}: missing {missing} (make them with `meshrl certs {path}`)")
    ca, key, cert = ((folder / name).read_bytes() for name in ("ca.pem", f"{role}.key", f"{role}.pem"))
    return ca, key, cert


def server_credentials(service_name: str) -> grpc.ServerCredentials | None:
    """The serving role's certificate, requiring a client certificate from the CA; None when TLS is off."""
    if not enabled():
        return None
    ca, key, cert = credentials(SERVER_ROLE.get(service_name, _role))
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel(address: str, service_name: str | None, options: list) -> grpc.Channel:
    """A channel to `address`: TLS with this process's certificate when MESHRL_TLS_DIR is set, checking
    that the server's certificate names the role serving `service_name` (any mesh role when None)."""
    if not enabled():
        return grpc.insecure_channel(address, options=options)
    ca, key, cert = credentials(_role)
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    expected = SERVER_ROLE.get(service_name or "", ANY_NAME)
    return grpc.secure_channel(address, creds, options=[*options, ("grpc.ssl_target_name_override", expected)])


def caller_role(context: grpc.ServicerContext) -> str | None:
    """The common name of the caller's certificate; None on a plain connection."""
    # grpc gives each property a list of values; types-grpcio says one bytes value
    auth = cast(Mapping[str, list[bytes]], context.auth_context() or {})
    names = auth.get("x509_common_name") or []
    return names[0].decode() if names else None


def make_certs(out: pathlib.Path, hosts: list[str], days: int = 365) -> list[pathlib.Path]:
    """A CA and a certificate per role under `out` (keys readable by their owner only). Each names its
    role, `meshrl`, localhost, 127.0.0.1 and `hosts` (the names or addresses services are reached by)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    written: list[pathlib.Path] = []
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshrl CA")])
    ca = _certificate(
        ca_name, ca_name, ca_key.public_key(), ca_key, days, x509.BasicConstraints(ca=True, path_length=0)
    )
    _save(out / "ca.pem", ca.public_bytes(serialization.Encoding.PEM), False, written)  # its key is not kept: rerun
    usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    for role in ROLES:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, role)])
        cert = _certificate(subject, ca_name, key.public_key(), ca_key, days, _alt_names(role, hosts), usage)
        _save(out / f"{role}.pem", cert.public_bytes(serialization.Encoding.PEM), False, written)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _save(out / f"{role}.key", pem, True, written)
    return written


def _save(path: pathlib.Path, data: bytes, secret: bool, written: list[pathlib.Path]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    written.append(path)


def _alt_names(role: str, hosts: list[str]):
    """The names a role's certificate answers to: its role, `meshrl`, localhost, 127.0.0.1 and hosts."""
    from cryptography import x509

    names: list[x509.GeneralName] = [x509.DNSName(n) for n in (role, ANY_NAME, "localhost")]
    for h in ["127.0.0.1", *hosts]:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _certificate(subject, issuer, public_key, sign_key, days: int, *extensions):
    """A certificate valid from five minutes ago for `days`, signed with SHA-256; the first extension
    (the CA's basic constraints) is critical, the others not."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )
    for i, extension in enumerate(extensions):
        critical = i == 0 and isinstance(extension, x509.BasicConstraints)
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(sign_key, hashes.SHA256())


def split_by_role(out: pathlib.Path) -> list[pathlib.Path]:
    """out/<role>/ holding ca.pem and that role's certificate and key only, for a deployment that hands
    each container (or host) its own folder: the reward service, which runs user code, then holds no key
    but its own and cannot present itself as the orchestrator. The keys at the top are removed."""
    folders = []
    for role in ROLES:
        folder = out / role
        folder.mkdir(mode=0o755, exist_ok=True)
        for name, secret in (("ca.pem", False), (f"{role}.pem", False), (f"{role}.key", True)):
            fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write((out / name).read_bytes())
        folders.append(folder)
    for role in ROLES:
        (out / f"{role}.key").unlink()
    return folders


def folder_role() -> str:
    """The role whose key MESHRL_TLS_DIR holds (the orchestrator's where it holds all): what a tool run in
    a service's container, such as `meshrl health`, presents."""
    folder = pathlib.Path(os.environ.get(VAR, ""))
    held = [role for role in ROLES if (folder / f"{role}.key").is_file()]
    return "orchestrator" if "orchestrator" in held or not held else held[0]
