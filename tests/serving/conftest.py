"""The fixtures of tests/support/auth_rig.py, for the HTTPS tests that also check auth."""

from tests.support.auth_rig import api_server, kube, registry

__all__ = ["api_server", "kube", "registry"]
