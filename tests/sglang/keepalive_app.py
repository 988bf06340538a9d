"""A minimal ASGI stand-in for SGLang's ``/generate``, served by a real uvicorn process.

Each answer names the client port it came in on (``meta_info.id`` is ``<rid>@<port>``), so a
test can tell a reused connection from a fresh one. Run it as uvicorn runs SGLang's app:
``python -m uvicorn keepalive_app:app --app-dir tests/sglang --timeout-keep-alive 1``.
"""

from __future__ import annotations

import json
from typing import Any


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    port = scope["client"][1] if scope.get("client") else 0
    if scope["path"] == "/generate":
        rid = json.loads(body).get("rid", "")
        answer: dict[str, Any] = {
            "output_ids": [7],
            "meta_info": {
                "id": f"{rid}@{port}",
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "finish_reason": {"type": "stop", "matched": 7},
            },
        }
    else:
        answer = {"status": "ok", "port": port}
    data = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})
