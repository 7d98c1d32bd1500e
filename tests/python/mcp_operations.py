"""An MCP client of `cairn mcp --operations FILE`, on the official Python SDK (`mcp` on PyPI).

Usage: mcp_operations.py MODE ARGUMENTS_JSON -- CAIRN MCP ARGV...

MODE `list` prints one JSON line: every tool with its description, input schema and `_meta`.
MODE `call` calls `deploy_release` with ARGUMENTS_JSON and prints its structured content
(after a line `calling`, flushed, so the caller knows the call was sent).
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main() -> None:
    mode, arguments = sys.argv[1], json.loads(sys.argv[2])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    server = StdioServerParameters(command=argv[0], args=argv[1:])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            if mode == "list":
                tools = (await session.list_tools()).tools
                out = [
                    {
                        "name": t.name,
                        "description": t.description,
                        "input_schema": t.input_schema,
                        "meta": t.meta,
                        "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True)
                        if t.annotations
                        else None,
                    }
                    for t in tools
                ]
                print(json.dumps({"tools": out}), flush=True)
            elif mode == "call":
                print("calling", flush=True)
                r = await session.call_tool("deploy_release", arguments)
                print(json.dumps({"is_error": r.is_error, "structured": r.structured_content,
                                  "text": [c.text for c in r.content if hasattr(c, "text")]}),
                      flush=True)
            else:
                raise SystemExit(f"unknown mode {mode}")


asyncio.run(main())
