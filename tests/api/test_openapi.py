"""The checked-in OpenAPI document is the one the app generates."""

from __future__ import annotations

import json
from pathlib import Path

from app.api.openapi_spec import openapi_document

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_checked_in_openapi_matches_the_app() -> None:
    assert SPEC.exists(), "run: .venv/bin/python -m app.api.openapi_spec"
    checked_in = json.loads(SPEC.read_text())
    assert checked_in == openapi_document(), (
        "openapi/openapi.json is out of date; regenerate with: .venv/bin/python -m app.api.openapi_spec"
    )


def test_debug_models_are_in_the_spec() -> None:
    schemas = openapi_document()["components"]["schemas"]
    for model in ("SnapshotResponse", "TerminalPage", "LeadershipResponse", "ProbeResponse"):
        assert model in schemas
