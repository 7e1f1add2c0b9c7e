"""Generate the Python code for proto/flexcomm/v1/*.proto with grpcio-tools.

    python proto/generate.py           # write the generated files next to the .proto
    python proto/generate.py --check   # exit 1 if the committed files are stale

protoc writes `from flexcomm.v1 import agent_pb2`, which would resolve against the
top-level `flexcomm` package (where no `v1` exists); the imports are rewritten to
`from flexcomm.proto.flexcomm.v1 import ...`, where the files are installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = PROTO_ROOT / "flexcomm" / "v1"
IMPORT_PREFIX = "flexcomm.proto."
_GENERATED_IMPORT = re.compile(r"^from flexcomm\.v1 import ", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(PACKAGE_DIR.glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc into `out_dir` (same layout as PROTO_ROOT); return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    sources = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(sources)}")
    written = sorted((out_dir / "flexcomm" / "v1").glob("*_pb2*.py"))
    for path in written:
        text = _GENERATED_IMPORT.sub(f"from {IMPORT_PREFIX}flexcomm.v1 import ", path.read_text())
        path.write_text(text)
    return written


def stale_files() -> list[str]:
    """Names of generated files that differ from what protoc produces now."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text() for p in generate(Path(tmp))}
    current = {p.name: p.read_text() for p in PACKAGE_DIR.glob("*_pb2*.py")}
    return sorted(n for n in fresh.keys() | current.keys() if fresh.get(n) != current.get(n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: proto/flexcomm/v1/{name} (run python proto/generate.py)")
        return 1 if stale else 0
    for path in generate(PROTO_ROOT):
        print(f"wrote {path.relative_to(PROTO_ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
