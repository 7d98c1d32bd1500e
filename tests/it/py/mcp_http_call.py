"""One tools/call over Streamable HTTP with the official MCP Python SDK.

Usage: mcp_http_call.py URL TOKEN TOOL ARGS_JSON

With CAIRN_TEST_CA set, the server's TLS certificate is checked against that file.

Prints JSON lines: {"event": "initialized"} once the session is up, then
{"event": "result", ...} with the tool result and what the client sent: how many
POSTs carried a tools/call, and how many GETs resumed a stream with Last-Event-ID.
"""

import asyncio
import json
import os
import ssl
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    url, token, tool, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    sent = {"tools_call_posts": 0, "resumes": 0}

    async def on_request(request: httpx2.Request) -> None:
        if request.method == "POST" and b'"tools/call"' in request.content:
            sent["tools_call_posts"] += 1
        if request.method == "GET" and "last-event-id" in request.headers:
            sent["resumes"] += 1

    ca = os.environ.get("CAIRN_TEST_CA")
    client = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"request": [on_request]},
        verify=ssl.create_default_context(cafile=ca) if ca else True,
    )
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                print(json.dumps({"event": "initialized"}), flush=True)
                try:
                    r = await session.call_tool(tool, args)
                    out = {
                        "event": "result",
                        "is_error": r.is_error,
                        "structured": r.structured_content,
                    }
                except Exception as e:  # the test prints it: a failure says why
                    out = {"event": "error", "error": repr(e)}
                out["sent"] = sent
                print(json.dumps(out), flush=True)


asyncio.run(main())
