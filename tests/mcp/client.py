"""`oomdoc mcp` driven by the reference Python SDK (`mcp`, from the package registry), as an assistant drives it:
initialize, list the tools, analyze a real snapshot and a real OOM archive, diff two real snapshots, explain a rule,
list a folder, and a bad path. Checks the typed results and the one-line error.

    python tests/mcp/client.py BINARY        (run by .ci/run in a venv with `pip install mcp`)
"""
import asyncio
import os
import sys
import tarfile
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL = os.path.join(ROOT, "fixtures", "real-gpu")


def check(ok, what):
    if not ok:
        raise SystemExit(f"mcp e2e: FAILED: {what}")


async def main(binary):
    params = StdioServerParameters(command=binary, args=["mcp"], cwd=ROOT)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check(init.server_info.name == "oomdoc", f"server name {init.server_info.name!r}")
            check("analyze" in (init.instructions or ""), "the instructions teach when to call analyze")
            tools = {t.name: t for t in (await session.list_tools()).tools}
            check(set(tools) >= {"analyze", "diff", "whatif", "facts", "budget", "explain", "list_inputs"},
                  f"tools {sorted(tools)}")
            check("files" in tools["analyze"].input_schema["properties"], "analyze takes files")

            # A real snapshot: the report's own schema, with the verdict.
            r = await session.call_tool("analyze", {"files": [os.path.join(REAL, "leaked-references", "snapshot.pickle")]})
            check(not r.is_error, f"analyze failed: {r.content}")
            doc = r.structured_content
            check(doc["schema_version"] == 1 and doc["tool"] == "oomdoc", "the report's schema")
            summary = doc["devices"][0]["verdict"]["summary"]
            check("ran out of memory" in summary and "leaked references" in summary.lower(), summary)

            # A real OOM archive: the snapshot, its log and nvidia-smi, in one tar.gz.
            with tempfile.TemporaryDirectory() as tmp:
                archive = os.path.join(tmp, "oom.tar.gz")
                with tarfile.open(archive, "w:gz") as t:
                    for name in ("snapshot.pickle", "stderr.log", "nvidia-smi.csv"):
                        t.add(os.path.join(REAL, "fragmentation", name), arcname="oom/" + name)
                r = await session.call_tool("analyze", {"files": [archive], "top": 3})
                check(not r.is_error, f"analyze of an archive failed: {r.content}")
                kinds = {i["kind"] for i in r.structured_content["inputs"]}
                check({"pytorch_snapshot", "log"} <= kinds, f"inputs read from the archive: {kinds}")
                check(r.structured_content["devices"][0]["verdict"]["primary_rule"] == "fragmentation",
                      "the archive's verdict")

            # Two real runs compared.
            r = await session.call_tool("diff", {
                "before": os.path.join(REAL, "fragmentation", "snapshot.pickle"),
                "after": os.path.join(REAL, "fragmentation-expandable", "snapshot.pickle"),
            })
            check(not r.is_error, f"diff failed: {r.content}")
            check(r.structured_content["findings_resolved"] == ["fragmentation"], str(r.structured_content)[:300])
            check(all("before_bytes" in d for d in r.structured_content["deltas"]), "typed deltas")

            # Proven on the trace: expandable segments on the real fragmentation capture.
            # (its log's OOM message gives the GPU's capacity)
            r = await session.call_tool("whatif", {
                "files": [os.path.join(REAL, "fragmentation", n) for n in ("snapshot.pickle", "stderr.log")],
                "set": ["expandable_segments:True"],
            })
            check(not r.is_error, f"whatif failed: {r.content}")
            w = r.structured_content["inputs"][0]["devices"][0]["whatif"]
            check(any(x["fits"] is True for x in w), f"whatif: {str(w)[:300]}")
            r = await session.call_tool("facts", {"files": [os.path.join(REAL, "fragmentation", "snapshot.pickle")]})
            check(not r.is_error and "oom.requested_bytes" in str(r.structured_content), "facts")
            r = await session.call_tool("budget", {"args": ["--params", "7e9", "--train", "--batch", "1", "--seq",
                                                            "2048", "--gpu", "h100-80gb"]})
            check(not r.is_error, f"budget failed: {r.content}")
            r = await session.call_tool("budget", {"args": ["--params", "7e9"]})
            check(r.is_error and "\n" not in r.content[0].text, f"budget without a run: {r.content}")

            r = await session.call_tool("explain", {"rule": "fragmentation"})
            check(not r.is_error and "expandable_segments" in r.content[0].text, "explain")
            r = await session.call_tool("list_inputs", {"path": os.path.join(REAL, "fragmentation")})
            check(not r.is_error, f"list_inputs failed: {r.content}")
            read_as = {os.path.basename(f["path"]): f.get("read_as") for f in r.structured_content["files"]}
            check(read_as.get("snapshot.pickle") == "snapshot" and read_as.get("stderr.log") == "log", f"list_inputs: {read_as}")

            # A bad path: a tool error with one line, and the server goes on answering.
            r = await session.call_tool("analyze", {"files": ["/no/such/oom.pickle"]})
            text = r.content[0].text
            check(r.is_error and text.startswith("oomdoc: error: /no/such/oom.pickle") and "\n" not in text, text)
            r = await session.call_tool("explain", {"rule": "no-such-rule"})
            check(r.is_error and "the rules are" in r.content[0].text, "an unknown rule")
            r = await session.call_tool("explain", {"rule": "leaked-references"})
            check(not r.is_error, "the server still answers after errors")
    print("mcp e2e: ok (initialize, tools, analyze on a snapshot and an archive, diff, whatif, facts, budget, "
          "explain, list_inputs, bad inputs as one-line tool errors)")


if __name__ == "__main__":
    asyncio.run(main(os.path.abspath(sys.argv[1])))
