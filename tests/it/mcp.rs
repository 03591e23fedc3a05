//! `oomdoc mcp` spoken to over its stdio, one JSON-RPC message per line, as any MCP client does: the handshake, the
//! tool list, a real snapshot's report as structured content, and a bad path as a one-line tool error after which
//! the server goes on answering. (tests/mcp/client.py drives it with the reference Python SDK in CI.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

struct Session {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Session {
    fn start() -> Session {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oomdoc"))
            .arg("mcp")
            .current_dir(crate::common::root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("oomdoc mcp starts");
        let out = BufReader::new(child.stdout.take().unwrap());
        Session { child, out, next: 1 }
    }

    fn send(&mut self, v: Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    /// A request's result (notifications the server sends meanwhile are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "the server closed stdout");
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn an_assistant_gets_the_report_schema_and_one_line_errors() {
    let mut s = Session::start();
    let init = s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}),
    );
    assert_eq!(init["serverInfo"]["name"], "oomdoc", "{init}");
    s.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let tools = s.call("tools/list", json!({}));
    let names: Vec<&str> = tools["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    for want in ["analyze", "diff", "explain", "list_inputs"] {
        assert!(names.contains(&want), "{names:?}");
    }

    let r = s.call(
        "tools/call",
        json!({"name": "analyze", "arguments": {"files": ["fixtures/real-gpu/leaked-references/snapshot.pickle"]}}),
    );
    assert_ne!(r["isError"], true, "{r}");
    let doc = &r["structuredContent"];
    assert_eq!(doc["schema_version"], 1);
    let summary = doc["devices"][0]["verdict"]["summary"].as_str().unwrap();
    assert!(summary.contains("ran out of memory asking for 16.0 MiB"), "{summary}");
    // The same document the command writes.
    let cli = crate::common::analyze_json(&["fixtures/real-gpu/leaked-references/snapshot.pickle", "--top", "5"]);
    assert_eq!(doc["devices"][0]["verdict"], cli["devices"][0]["verdict"]);

    let r = s.call("tools/call", json!({"name": "analyze", "arguments": {"files": ["no/such.pickle"]}}));
    assert_eq!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("oomdoc: error: no/such.pickle: ") && !text.contains('\n'), "{text}");
    let r = s.call("tools/call", json!({"name": "analyze", "arguments": {"files": ["README.md"]}}));
    assert_eq!(r["isError"], true, "a file that is no artifact: {r}");

    let r = s.call("tools/call", json!({"name": "explain", "arguments": {"rule": "fragmentation"}}));
    assert!(r["content"][0]["text"].as_str().unwrap().starts_with("fragmentation — "), "{r}");
}
