"""Every cairn tool called once with the official MCP Python SDK over Streamable HTTP.

Usage: mcp_sdk_tools.py URL TOKEN COMMAND

The SDK checks each successful result's structured content against the tool's output schema
(`ClientSession.call_tool` raises when it does not conform), so a schema that does not match
what the server answers fails here. Calls: tools/list, then run_command with COMMAND; prints
{"event": "listed", "tools": ...}. On a line "again" on stdin, the same call again while the
first is in flight (it attaches); once both answered, execution_status, read_output, and
execution_status of an unknown ID (an error result). Prints one JSON line with what each
returned.
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def dump(r) -> dict:
    return {"is_error": r.is_error, "structured": r.structured_content}


async def main() -> None:
    url, token, command = sys.argv[1], sys.argv[2], sys.argv[3]
    client = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300)
    )
    out: dict = {}
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                tools = await session.list_tools()
                out["tools"] = {
                    t.name: {
                        "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True)
                        if t.annotations
                        else None,
                        "output_schema": t.output_schema,
                    }
                    for t in tools.tools
                }
                print(json.dumps({"event": "listed", "tools": out["tools"]}), flush=True)
                args = {"destination": "127.0.0.1", "command": command}
                loop = asyncio.get_event_loop()
                try:
                    t1 = asyncio.create_task(session.call_tool("run_command", args))
                    await loop.run_in_executor(None, sys.stdin.readline)
                    again = await session.call_tool("run_command", args)
                    first = await t1
                    out["first"] = dump(first)
                    out["again"] = dump(again)
                    ex = first.structured_content["execution_id"]
                    out["status"] = dump(
                        await session.call_tool("execution_status", {"execution_id": ex})
                    )
                    out["output"] = dump(
                        await session.call_tool("read_output", {"execution_id": ex})
                    )
                    out["unknown"] = dump(
                        await session.call_tool(
                            "execution_status", {"execution_id": "ex_01jzzzzzzzzzzzzzzzzzzzzzzz"}
                        )
                    )
                except Exception as e:  # the test prints it: a failure says why
                    out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)


asyncio.run(main())
