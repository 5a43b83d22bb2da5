"""The shipped stubs are what grpcio-tools makes of proto/ today: a change to
the proto without regenerating them fails here. Regenerate with:

    python -m grpc_tools.protoc -Iproto --python_out=clients/python/src \\
      --pyi_out=clients/python/src --grpc_python_out=clients/python/src proto/ctxbudget/v1/budget.proto
"""

import pathlib
import tempfile

from grpc_tools import protoc

from conftest import REPO

GENERATED = ["budget_pb2.py", "budget_pb2.pyi", "budget_pb2_grpc.py"]


def test_the_shipped_stubs_match_the_proto():
    shipped = REPO / "clients" / "python" / "src" / "ctxbudget" / "v1"
    with tempfile.TemporaryDirectory() as out:
        rc = protoc.main([
            "protoc", f"-I{REPO / 'proto'}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", str(REPO / "proto" / "ctxbudget" / "v1" / "budget.proto"),
        ])
        assert rc == 0
        for name in GENERATED:
            fresh = (pathlib.Path(out) / "ctxbudget" / "v1" / name).read_text()
            assert (shipped / name).read_text() == fresh, f"{name} is stale: regenerate it (see this file's doc)"
