"""Write the service's OpenAPI document: ``python -m app.api.openapi_spec [PATH]``.

The default PATH is openapi/openapi.json, which a test compares with the app.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from app.config import Settings

DEFAULT_PATH = Path("openapi/openapi.json")


def openapi_document() -> dict[str, Any]:
    from app.main import create_app

    # Nothing starts: building the app does not run its lifespan.
    settings = Settings(leader_election=False, identity="openapi", lease_namespace="default")
    return create_app(settings).openapi()


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
