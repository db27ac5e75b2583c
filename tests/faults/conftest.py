"""The fault-injection tests start servers as the server tests do (tests/server/conftest.py)."""

from tests.server.conftest import served  # noqa: F401  (a fixture, used by name)
