"""Builds the tumbler_client wheel: compiles tumbler/v1/lock.proto into
tumbler_client/v1 (messages, stubs and .pyi type hints) inside the build
directory, and ships the .proto beside them.

The proto is found in $TUMBLER_PROTO_DIR, else ../../proto (a checkout of
the repository), else proto/ in this folder (an sdist).
"""
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("tumbler", "v1", "lock.proto")


def proto_dir():
    for d in (os.environ.get("TUMBLER_PROTO_DIR"), os.path.join(HERE, "..", "..", "proto"), os.path.join(HERE, "proto")):
        if d and os.path.exists(os.path.join(d, PROTO)):
            return d
    raise SystemExit(f"{PROTO} not found: set TUMBLER_PROTO_DIR to the repository's proto/ folder")


def compile_stubs(out_pkg):
    """protoc into out_pkg (tumbler_client/v1), imports made package-relative."""
    import importlib.resources

    from grpc_tools import protoc

    src = proto_dir()
    tmp = out_pkg + ".protoc"
    os.makedirs(tmp, exist_ok=True)
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    args = ["protoc", f"-I{src}", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}", PROTO]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {os.path.join(src, PROTO)}")
    os.makedirs(out_pkg, exist_ok=True)
    for name in ("lock_pb2.py", "lock_pb2.pyi", "lock_pb2_grpc.py"):
        with open(os.path.join(tmp, "tumbler", "v1", name)) as f:
            code = f.read()
        # `from tumbler.v1 import lock_pb2` -> `from . import lock_pb2`: no top-level `tumbler` package.
        code = re.sub(r"^from tumbler\.v1 import ", "from . import ", code, flags=re.M)
        with open(os.path.join(out_pkg, name), "w") as f:
            f.write(code)
    shutil.copy(os.path.join(src, PROTO), os.path.join(out_pkg, "lock.proto"))
    with open(os.path.join(out_pkg, "__init__.py"), "w") as f:
        f.write('"""Generated from tumbler/v1/lock.proto when the package was built."""\n')
    shutil.rmtree(tmp)


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        compile_stubs(os.path.join(self.build_lib, "tumbler_client", "v1"))


class SdistWithProto(sdist):
    """An sdist carries the proto, so it builds without the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = os.path.join(base_dir, "proto", "tumbler", "v1")
        os.makedirs(dest, exist_ok=True)
        shutil.copy(os.path.join(proto_dir(), PROTO), dest)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto})
