"""Generated from proto/ctxbudget/v1/budget.proto by grpcio-tools (see tests/test_stubs.py)."""
