"""A kubeconfig file for a test API server (a stub or a fake; the simulated cluster writes its own)."""

from __future__ import annotations

from pathlib import Path


def write_kubeconfig(
    path: Path, server: str, *, token: str | None = None, token_file: Path | None = None
) -> Path:
    """Context "test" → ``server`` with a bearer token (or token file); context "other" → an unused port."""
    user = f"    tokenFile: {token_file}\n" if token_file else f"    token: {token}\n"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters:\n- name: c\n  cluster:\n    server: {server}\n"
        "- name: other\n  cluster:\n    server: http://127.0.0.1:1\n"
        "contexts:\n- name: test\n  context:\n    cluster: c\n    user: u\n"
        "- name: other\n  context:\n    cluster: other\n    user: u\n"
        f"users:\n- name: u\n  user:\n{user}"
    )
    return path
