"""A FastMCP client (with the tasks extension from fastmcp-tasks) driven by JSON lines.

Usage: fastmcp_client.py URL TOKEN
       fastmcp_client.py stdio ARGV_JSON   (the server as a child process over stdio)

FastMCP's client advertises `io.modelcontextprotocol/tasks` by itself; when a server answers
a `tools/call` with a task, `call_tool` polls `tasks/get` to the result under the hood. The
project did not write this client: the tests use it as a user's agent would.

Reads one JSON command per line on stdin and prints one JSON line for each:
  {"op": "list"}                            -> {"tools": [{name, annotations, output_schema, ...}]}
  {"op": "call", "tool": T, "args": A}      -> {"is_error", "structured", "text"} (call_tool)
  {"op": "start", "tool": T, "args": A}     -> {"task_id", "status"} (call_tool_task)
  {"op": "status", "task_id": I}            -> {"status", "status_message"} (tasks/get)
  {"op": "result", "task_id": I}            -> {"is_error", "structured", "text"}
  {"op": "cancel", "task_id": I}            -> {"status"} (tasks/cancel, then tasks/get)
A command that fails prints {"error": ...}. Every line also carries "sent": what the client
sent so far (POSTs by JSON-RPC method, and the Mcp-Name headers it set).
"""

import asyncio
import json
import os
import sys

import httpx2
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from fastmcp_tasks import call_tool_task

SENT: dict = {"methods": {}, "mcp_name": []}


async def on_request(request: httpx2.Request) -> None:
    if request.method != "POST":
        return
    try:
        method = json.loads(request.content).get("method", "")
    except (ValueError, AttributeError):
        method = "?"
    SENT["methods"][method] = SENT["methods"].get(method, 0) + 1
    if "mcp-name" in request.headers:
        SENT["mcp_name"].append([method, request.headers["mcp-name"]])


def factory(**kwargs):
    kwargs.setdefault("timeout", httpx2.Timeout(30, read=300))
    kwargs["event_hooks"] = {"request": [on_request]}
    return httpx2.AsyncClient(**kwargs)


def tool_result(r) -> dict:
    text = [c.text for c in (r.content or []) if getattr(c, "type", "") == "text"]
    return {"is_error": r.is_error, "structured": r.structured_content, "text": text}


async def run(client: Client, tasks: dict, cmd: dict) -> dict:
    op = cmd["op"]
    if op == "list":
        tools = await client.list_tools()
        return {
            "tools": [
                {
                    "name": t.name,
                    "description": t.description,
                    "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True)
                    if t.annotations
                    else None,
                    "input_schema": t.input_schema,
                    "output_schema": t.output_schema,
                }
                for t in tools
            ]
        }
    if op == "call":
        r = await client.call_tool_mcp(cmd["tool"], cmd.get("args", {}))
        return tool_result(r)
    if op == "start":
        t = await call_tool_task(client, cmd["tool"], cmd.get("args", {}), raise_on_error=False)
        tasks[t.task_id] = t
        return {"task_id": t.task_id, "status": t.create_result.status}
    if op == "status":
        s = await tasks[cmd["task_id"]].status()
        return {"status": s.status, "status_message": s.status_message}
    if op == "result":
        r = await tasks[cmd["task_id"]].result()
        return {"is_error": r.is_error, "structured": r.structured_content,
                "text": [c.text for c in (r.content or []) if getattr(c, "type", "") == "text"]}
    if op == "cancel":
        t = tasks[cmd["task_id"]]
        await t.cancel()
        s = await t.status()
        return {"status": s.status, "status_message": s.status_message}
    return {"error": f"unknown op {op}"}


async def main() -> None:
    if sys.argv[1] == "stdio":
        argv = json.loads(sys.argv[2])
        transport = StdioTransport(argv[0], argv[1:], env=dict(os.environ))
    else:
        url, token = sys.argv[1], sys.argv[2]
        transport = StreamableHttpTransport(url, auth=token, httpx_client_factory=factory)
    tasks: dict = {}
    loop = asyncio.get_event_loop()
    async with Client(transport) as client:
        print(json.dumps({"event": "initialized"}), flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            try:
                out = await run(client, tasks, cmd)
            except Exception as e:  # the test prints it: a failure says why
                out = {"error": f"{type(e).__name__}: {e}"}
            out["sent"] = SENT
            print(json.dumps(out, default=str), flush=True)


asyncio.run(main())
