"""GET /docs: the API's endpoints and request schemas, readable in a browser with no internet access.

FastAPI's Swagger UI loads its scripts from a CDN, so on an air-gapped cluster or a laptop offline it is a
blank page. This page is one self-contained HTML document: its script reads /openapi.json from this server
and nothing else.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flotilla-server API</title>
<style>
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }
h2 { font-size: 1.1rem; margin-top: 2rem; } code, pre { background: #f4f4f4; padding: 0.1rem 0.3rem; }
pre { padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
</style></head>
<body><h1>flotilla-server API</h1>
<p>The OpenAPI schema itself: <a href="/openapi.json">/openapi.json</a>. The guide: docs/serving.md.</p>
<div id="api">Loading /openapi.json ...</div>
<script>
fetch("/openapi.json").then(r => r.json()).then(spec => {
  const out = document.getElementById("api");
  out.textContent = "";
  const schemas = (spec.components || {}).schemas || {};
  for (const [path, methods] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      const h = document.createElement("h2");
      h.textContent = method.toUpperCase() + " " + path + (op.summary ? ": " + op.summary : "");
      out.appendChild(h);
      const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
      const ref = body && body.schema && (body.schema["$ref"] || "").split("/").pop();
      if (ref && schemas[ref]) {
        const pre = document.createElement("pre");
        pre.textContent = JSON.stringify(schemas[ref].properties || schemas[ref], null, 2);
        out.appendChild(pre);
      }
    }
  }
}).catch(e => { document.getElementById("api").textContent = "Could not read /openapi.json: " + e; });
</script></body></html>
"""


@router.get("/docs", include_in_schema=False)
async def docs_page() -> HTMLResponse:
    return HTMLResponse(PAGE)
