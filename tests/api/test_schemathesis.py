"""schemathesis against the checked-in openapi/openapi.json, on a LIVE server: the exporter process on
127.0.0.1:<free port> in simulate mode (embedded SimulatedCluster plus workload
generator, so /debug/terminal has entries to page through), leader election off.

For every documented operation, positive and negative cases: no 5xx, every response conforms to its
documented status codes, content type and schema (schemathesis' default checks), and bad query
parameters are rejected with 4xx and a JSON body.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

schemathesis = pytest.importorskip("schemathesis")

from schemathesis import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from tests.support.replica_process import ReplicaProcess, running  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
PAGE_MAX = 50  # terminal_page_max of the server under test

SCHEMA = schemathesis.openapi.from_path(OPENAPI)
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]
LABELS = sorted(op.label for op in OPERATIONS)
# Negative cases need something to break: only operations with query parameters get them (a header
# declared `string | null` has no negative value schemathesis can send).
WITH_PARAMETERS = sorted(
    op.label for op in OPERATIONS if any(p.location == "query" for p in op.iter_parameters())
)
CASES = [(label, GenerationMode.POSITIVE) for label in LABELS] + [
    (label, GenerationMode.NEGATIVE) for label in WITH_PARAMETERS
]


# The app in simulate mode, as the CLI runs it (tests/support/replica_process.py), no probe listener.
LIVE_SETTINGS: dict[str, Any] = {
    "simulate": True,
    "leader_election": False,
    "terminal_page_max": PAGE_MAX,
    "host": "127.0.0.1",
    "port": 0,
    "probe_port": None,
    "sim_jobs": 40,
    "sim_rate": 20.0,
    "sim_seed": 11,
}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaProcess]:
    log = tmp_path_factory.mktemp("schemathesis") / "exporter.log"
    with running(log, LIVE_SETTINGS) as server:
        # Ready (informers synced, exporting), and some TrainJobs have finished: /debug/terminal has pages.
        def terminal_entries() -> bool:
            total = httpx.get(server.url + "/debug/terminal", params={"limit": 1}).json().get("total", 0)
            return bool(total >= 3)

        wait_for(terminal_entries, timeout=30, what="terminal entries on the live server")
        yield server


def _over_page_max(case: Any) -> bool:
    limit = (case.query or {}).get("limit")
    return isinstance(limit, int) and not isinstance(limit, bool) and limit > PAGE_MAX


def _operation(label: str) -> Any:
    return next(op for op in OPERATIONS if op.label == label)


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{label}-{mode.value}" for label, mode in CASES])
def test_operation_conforms_to_the_schema(live: ReplicaProcess, label: str, mode: Any) -> None:
    op = _operation(label)

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        # Schema-valid but semantically invalid by design, so positive_data_acceptance cannot apply (every
        # other check still does, including the schema of the 4xx body):
        # - limit's maximum is terminal_page_max, a runtime setting the static schema cannot state (its
        #   description does): 422;
        # - `continue` is an opaque token only the server mints; a generated string is not one: 400.
        expected = set()
        if _over_page_max(case):
            expected.add(422)
        if (case.query or {}).get("continue") is not None:
            expected.add(400)
        excluded = [positive_data_acceptance] if expected and mode == GenerationMode.POSITIVE else []
        response = case.call_and_validate(base_url=live.url, timeout=10, excluded_checks=excluded)
        assert response.status_code < 500, response.text
        if excluded and response.status_code != 200:
            assert response.status_code in expected, response.text

    run()


BAD_QUERIES: list[dict[str, str]] = [
    {"limit": "abc"},
    {"limit": "0"},
    {"limit": "-1"},
    {"limit": "1.5"},
    {"limit": "1e3"},
    {"limit": ""},
    {"limit": "100000"},
    {"limit": str(PAGE_MAX + 1)},
    {"limit": "9" * 40},
    {"continue": "garbage"},
    {"continue": "not base64 !!"},
    {"continue": "AAAA"},
    {"continue": "x" * 513},
    {"continue": "eyJhIjogMX0="},  # base64 of {"a": 1}
    {"limit": "5", "continue": "%00"},
]


@pytest.mark.parametrize("query", BAD_QUERIES, ids=lambda q: "&".join(f"{k}={v[:12]}" for k, v in q.items()))
def test_bad_query_parameters_get_4xx_with_a_json_body(live: ReplicaProcess, query: dict[str, str]) -> None:
    resp = httpx.get(live.url + "/debug/terminal", params=query)
    assert 400 <= resp.status_code < 500, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert body.get("detail")
    # and the body matches the schema documented for that status
    op = _operation("GET /debug/terminal")
    case = op.Case(query=query)
    case.validate_response(resp)


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(limit=st.integers(1, PAGE_MAX))
def test_terminal_pages_walk_without_errors(live: ReplicaProcess, limit: int) -> None:
    token: str | None = None
    for _ in range(3):
        params: dict[str, Any] = {"limit": limit}
        if token:
            params["continue"] = token
        resp = httpx.get(live.url + "/debug/terminal", params=params)
        assert resp.status_code == 200, resp.text
        page = resp.json()
        assert len(page["items"]) <= limit
        token = page.get("continue")
        if not token:
            break
