#!/usr/bin/env python3
"""Generate the Python gRPC stubs from ../../proto into ./tumbler/v1 (gitignored).

Run once after cloning and after every change to proto/ (the helper module
runs it for you when the stubs are missing). Needs grpcio-tools.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.environ.get("TUMBLER_PROTO_DIR", os.path.join(HERE, "..", "..", "proto"))


def generate(out_dir=HERE):
    from grpc_tools import protoc
    import importlib.resources

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        "tumbler/v1/lock.proto",
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + os.path.join(PROTO_ROOT, "tumbler/v1/lock.proto"))
    # Make the output importable as the package `tumbler.v1`.
    for pkg in ("tumbler", os.path.join("tumbler", "v1")):
        init = os.path.join(out_dir, pkg, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()


if __name__ == "__main__":
    generate()
    print("generated", os.path.join(HERE, "tumbler", "v1"), file=sys.stderr)
