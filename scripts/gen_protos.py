"""Regenerate the Python code of ``protos/`` (run from the repository root).

Message code goes to ``lr_client/_proto`` (protobuf only, so the client never
imports grpc); the service stubs go to ``lr_server/_proto``.

    python scripts/gen_protos.py            # write the files
    python scripts/gen_protos.py --check    # exit 1 if they would change
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "lr/replication.proto"
OUTPUTS = {
    "lr/replication_pb2.py": "lr_client/_proto/replication_pb2.py",
    "lr/replication_pb2.pyi": "lr_client/_proto/replication_pb2.pyi",
    "lr/replication_pb2_grpc.py": "lr_server/_proto/replication_pb2_grpc.py",
}


def generate() -> dict[str, str]:
    """Return {repository path: generated text}."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{ROOT / 'protos'}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                PROTO,
            ],
            check=True,
        )
        out = {}
        for produced, target in OUTPUTS.items():
            text = (Path(tmp) / produced).read_text()
            text = text.replace(
                "from lr import replication_pb2 as",
                "from lr_client._proto import replication_pb2 as",
            )
            out[target] = text
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for target, text in generate().items():
        path = ROOT / target
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(target)
        else:
            path.write_text(text)
    if stale:
        print("generated code is stale: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
