"""The auth tests' fixtures: a token registry, the API server that reviews its tokens, a client of it, and
a protected app (tests/support/auth_rig.py)."""

from tests.support.auth_rig import api_server, harness, kube, registry

__all__ = ["api_server", "harness", "kube", "registry"]
