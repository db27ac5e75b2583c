"""The fault tests start servers as the server tests do (tests/server/conftest.py)."""

from tests.server.conftest import served  # noqa: F401 (the fixture)
