"""/docs: the HTTP API reference as one self-contained HTML page, rendered by the service from its own
OpenAPI schema.

FastAPI's default /docs loads Swagger UI's JavaScript and CSS from a CDN, so in an air-gapped cluster it shows
a blank page; this page needs nothing but the service (no script, no stylesheet, no external link).
/openapi.json stays the machine-readable form. With auth on, both are behind the bearer-token check
(``DEFAULT_PROTECTED_PREFIXES`` in app/api/auth/middleware.py): they describe the /debug endpoints too.
"""

from __future__ import annotations

from html import escape
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f'<a href="#schema-{escape(name)}">{escape(name)}</a>'
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    if "anyOf" in schema:
        return " | ".join(_schema_name(s) for s in schema["anyOf"])
    return escape(str(schema.get("type", "any")))


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    out = [f"<h3><code>{method.upper()} {escape(path)}</code></h3>"]
    for key in ("summary", "description"):
        if op.get(key):
            out.append(f"<p>{escape(str(op[key]))}</p>")
    params = op.get("parameters") or []
    if params:
        out.append("<table><tr><th>parameter</th><th>in</th><th>type</th><th>required</th><th></th></tr>")
        for p in params:
            out.append(
                f"<tr><td><code>{escape(p['name'])}</code></td><td>{escape(p.get('in', ''))}</td>"
                f"<td>{_schema_name(p.get('schema', {}))}</td><td>{'yes' if p.get('required') else 'no'}</td>"
                f"<td>{escape(str(p.get('description', '')))}</td></tr>"
            )
        out.append("</table>")
    out.append("<ul>")
    for code, resp in (op.get("responses") or {}).items():
        kinds = [
            f"{escape(ctype)}: {_schema_name(body.get('schema', {}))}"
            for ctype, body in (resp.get("content") or {}).items()
        ]
        detail = f" ({'; '.join(kinds)})" if kinds else ""
        out.append(f"<li>{escape(str(code))} {escape(str(resp.get('description', '')))}{detail}</li>")
    out.append("</ul>")
    return "\n".join(out)


def _component(name: str, schema: dict[str, Any]) -> str:
    out = [f'<h3 id="schema-{escape(name)}"><code>{escape(name)}</code></h3>']
    if schema.get("description"):
        out.append(f"<p>{escape(str(schema['description']))}</p>")
    props = schema.get("properties") or {}
    if props:
        required = set(schema.get("required") or [])
        out.append("<table><tr><th>field</th><th>type</th><th>required</th><th></th></tr>")
        for field, prop in props.items():
            out.append(
                f"<tr><td><code>{escape(field)}</code></td><td>{_schema_name(prop)}</td>"
                f"<td>{'yes' if field in required else 'no'}</td>"
                f"<td>{escape(str(prop.get('description', '')))}</td></tr>"
            )
        out.append("</table>")
    return "\n".join(out)


def render_docs(schema: dict[str, Any]) -> str:
    info = schema.get("info", {})
    title = escape(f"{info.get('title', '')} {info.get('version', '')}".strip())
    body = [
        f"<h1>{title}</h1>",
        f"<p>{escape(str(info.get('description', '')))}</p>",
        '<p>Machine-readable: <a href="openapi.json">openapi.json</a>.</p>',
        "<h2>Endpoints</h2>",
    ]
    for path, item in sorted((schema.get("paths") or {}).items()):
        for method in METHODS:
            if method in item:
                body.append(_operation(path, method, item[method]))
    components = (schema.get("components") or {}).get("schemas") or {}
    if components:
        body.append("<h2>Schemas</h2>")
        body += [_component(name, components[name]) for name in sorted(components)]
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
    )
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def install_docs(app: FastAPI, path: str = "/docs") -> None:
    """Serve the page at ``path``; create the app with ``docs_url=None, redoc_url=None`` (no CDN pages)."""

    # The endpoint reads the app from the request, never from a closure: FastAPI keeps every endpoint
    # function in module-level caches (fastapi.dependencies.models, lru_cache of 4096 callables), so a
    # closure over ``app`` would keep each app ever built, its ``state.service`` and all that replica's
    # caches alive after it stopped (tests/chaos/test_no_leak.py).
    @app.get(path, response_class=HTMLResponse, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(render_docs(request.app.openapi()))
