"""Regenerates meshrl/v1/*_pb2*.py from protos/meshrl/v1/*.proto.

Run `python -m meshrl.protogen` after editing a proto (needs grpcio-tools, in the
`test` extra). `generate(out_dir)` is also what the staleness test calls.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"


def proto_files() -> list[pathlib.Path]:
    return sorted((PROTO_DIR / "meshrl" / "v1").glob("*.proto"))


def generate(out_dir: pathlib.Path) -> None:
    """Write the generated modules under out_dir/meshrl/v1/."""
    from grpc_tools import protoc  # only needed when regenerating

    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_DIR)) for p in proto_files()),
    ]
    (out_dir / "meshrl" / "v1").mkdir(parents=True, exist_ok=True)
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def main() -> None:
    generate(ROOT)
    print(f"generated {len(proto_files())} protos into {ROOT / 'meshrl' / 'v1'}", file=sys.stderr)


if __name__ == "__main__":
    main()
