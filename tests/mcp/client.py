"""A real MCP client (the Python `mcp` package) against `worktreefs mcp`: initialize,
list the tools, create a worktree, lease it, run a turn, release it, and a refused call.
Prints one JSON object with what it saw; tests/mounted/mcp.rs checks it.

usage: client.py WORKTREEFS STATE_DIR
"""
import asyncio
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def result(r):
    texts = [getattr(c, "text", "") for c in r.content]
    # A refusal: the message for people first, then its typed JSON.
    refusal = None
    if r.is_error and len(texts) > 1:
        try:
            refusal = json.loads(texts[-1])
        except ValueError:
            pass
    return {
        "is_error": bool(r.is_error),
        "structured": r.structured_content,
        "text": texts[0] if texts else "",
        "refusal": refusal,
    }


async def main(exe, state):
    params = StdioServerParameters(command=exe, args=["--state-dir", state, "mcp"])
    seen = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            seen["server"] = init.server_info.name
            tools = await session.list_tools()
            seen["tools"] = {
                t.name: {
                    "input": t.input_schema,
                    "output": t.output_schema,
                    "annotations": (
                        t.annotations.model_dump(by_alias=True, exclude_none=True)
                        if t.annotations
                        else None
                    ),
                }
                for t in tools.tools
            }
            seen["create"] = result(
                await session.call_tool("create_worktree", {"worktree": "repo/agent"})
            )
            seen["create_again"] = result(
                await session.call_tool("create_worktree", {"worktree": "repo/agent"})
            )
            seen["acquire"] = result(
                await session.call_tool(
                    "acquire_lease",
                    {"worktree": "repo/agent", "session": "s1", "exclusive": True},
                )
            )
            seen["acquire_other"] = result(
                await session.call_tool(
                    "acquire_lease",
                    {"worktree": "repo/agent", "session": "s2", "exclusive": True},
                )
            )
            seen["turn"] = result(
                await session.call_tool(
                    "run_turn",
                    {
                        "worktree": "repo/agent",
                        "session": "s1",
                        "command": ["sh", "-c", "git rev-parse --abbrev-ref HEAD; exit 7"],
                    },
                )
            )
            seen["turn_timeout"] = result(
                await session.call_tool(
                    "run_turn",
                    {
                        "worktree": "repo/agent",
                        "session": "s1",
                        "command": ["sleep", "30"],
                        "timeout_secs": 1,
                    },
                )
            )
            # One that ignores SIGTERM (and what it starts, too) is killed 5 s later.
            started = time.monotonic()
            seen["turn_stubborn"] = result(
                await session.call_tool(
                    "run_turn",
                    {
                        "worktree": "repo/agent",
                        "session": "s1",
                        "command": [
                            "sh",
                            "-c",
                            "trap '' TERM; echo begun; echo said >&2; sleep 60 & wait",
                        ],
                        "timeout_secs": 1,
                    },
                )
            )
            seen["turn_stubborn"]["secs"] = time.monotonic() - started
            # A timeout reported whatever the command's last output was: a progress bar's
            # carriage return, no newline at the end.
            seen["turn_progress"] = result(
                await session.call_tool(
                    "run_turn",
                    {
                        "worktree": "repo/agent",
                        "session": "s1",
                        "command": [
                            "sh",
                            "-c",
                            "echo out; printf 'compiling 3/10\\r' >&2; sleep 30",
                        ],
                        "timeout_secs": 1,
                    },
                )
            )
            # A command whose whole stderr is JSON with an "error" is the command's
            # output, not a refusal of the turn.
            seen["turn_json_stderr"] = result(
                await session.call_tool(
                    "run_turn",
                    {
                        "worktree": "repo/agent",
                        "session": "s1",
                        "command": [
                            "sh",
                            "-c",
                            "echo important; echo '{\"error\": \"boom\"}' >&2; exit 2",
                        ],
                    },
                )
            )
            # A timeout too large for any clock is no timeout, and no fault.
            seen["turn_huge_timeout"] = result(
                await session.call_tool(
                    "run_turn",
                    {
                        "worktree": "repo/agent",
                        "session": "s1",
                        "command": ["true"],
                        "timeout_secs": 18446744073709551615,
                    },
                )
            )
            # The command swaps the report file's name for a FIFO: the server reads the
            # file it made, through its own descriptor, and does not hang.
            seen["turn_swaps_report"] = result(
                await session.call_tool(
                    "run_turn",
                    {
                        "worktree": "repo/agent",
                        "session": "s1",
                        "command": [
                            "sh",
                            "-c",
                            "R=$(tr '\\0' '\\n' < /proc/$PPID/cmdline | sed -n -e 's/^--report=//p' -e '/^--report$/{n;p;}'); "
                            "rm -f \"$R\" && mkfifo \"$R\" && echo swapped; exit 3",
                        ],
                    },
                )
            )
            # A turn that could not say how it ended (its arguments refused) is an error.
            seen["turn_bad_worktree"] = result(
                await session.call_tool(
                    "run_turn",
                    {"worktree": "--bogus", "session": "s1", "command": ["true"]},
                )
            )
            seen["show"] = result(
                await session.call_tool("show_worktree", {"worktree": "repo/agent"})
            )
            seen["release"] = result(
                await session.call_tool(
                    "release_lease", {"worktree": "repo/agent", "session": "s1"}
                )
            )
            seen["release_again"] = result(
                await session.call_tool(
                    "release_lease", {"worktree": "repo/agent", "session": "s1"}
                )
            )
            seen["list"] = result(await session.call_tool("list_worktrees", {}))
    print(json.dumps(seen))


asyncio.run(main(sys.argv[1], sys.argv[2]))
