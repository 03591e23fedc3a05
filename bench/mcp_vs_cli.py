#!/usr/bin/env python3
"""The MCP server's `analyze` against the command's own time on the same file (issue 35: within +10%).

    python3 bench/mcp_vs_cli.py BINARY FILE [ROUNDS]

Each round: `BINARY analyze FILE --format json --top 5` as a process (start to exit), then one `analyze` call to an
`BINARY mcp` session already initialised (request written to the answer read). Prints the medians and the ratio.
"""
import json
import statistics
import subprocess
import sys
import time


def rpc(proc, msg):
    proc.stdin.write(json.dumps(msg) + "\n")
    proc.stdin.flush()
    if "id" not in msg:
        return None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("the server closed its output")
        v = json.loads(line)
        if v.get("id") == msg["id"]:
            return v


def main():
    binary, file = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    cli, mcp = [], []
    server = subprocess.Popen([binary, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rpc(server, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
    rpc(server, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    for i in range(rounds):
        t = time.perf_counter()
        subprocess.run([binary, "analyze", file, "--format", "json", "--top", "5", "--no-progress"],
                       stdout=subprocess.DEVNULL, check=False)
        cli.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = rpc(server, {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                         "params": {"name": "analyze", "arguments": {"files": [file]}}})
        mcp.append(time.perf_counter() - t)
        if r["result"].get("isError"):
            raise SystemExit(f"analyze failed: {r['result']['content'][0]['text']}")
    server.stdin.close()
    server.wait()
    c, m = statistics.median(cli), statistics.median(mcp)
    print(f"oomdoc analyze --format json  median {c:.3f} s  best {min(cli):.3f} s")
    print(f"mcp analyze                   median {m:.3f} s  best {min(mcp):.3f} s")
    print(f"mcp / cli                     {m / c:.2f}")


if __name__ == "__main__":
    main()
