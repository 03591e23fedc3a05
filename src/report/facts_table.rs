//! `oomdoc facts`: every fact the rules can test, with its value and what it means (the way to debug a rule).

use crate::analysis::facts::Facts;
use crate::analysis::Analysis;

/// Per device, then the job's own facts (logs, profiler exports), then each Nsight Compute launch's; as a table,
/// or with `json` as one object of objects.
pub fn render(analyses: &[&Analysis], json: bool) -> String {
    let mut out = String::new();
    let mut as_json = serde_json::Map::new();
    for a in analyses {
        let input = a.inputs.last().map_or("", |i| i.path.as_str()).to_string();
        let mut groups: Vec<(String, &Facts)> =
            a.devices.iter().map(|d| (format!("{input}#{}", d.device), &d.facts)).collect();
        if a.job_facts.iter().next().is_some() {
            groups.push((format!("{input} (job)"), &a.job_facts));
        }
        for (i, k) in a.kernel_facts.iter().enumerate() {
            groups.push((format!("{input} kernel #{i}"), k));
        }
        for (key, facts) in groups {
            if json {
                let mut m = serde_json::Map::new();
                for (name, f) in facts.iter() {
                    m.insert(name.clone(), serde_json::Value::String(f.display("")));
                }
                as_json.insert(key, serde_json::Value::Object(m));
                continue;
            }
            out.push_str(&format!("{key}\n"));
            for (name, f) in facts.iter() {
                out.push_str(&format!("  {:<40} {:<24} {}\n", name, f.display(""), f.doc));
            }
        }
    }
    if json {
        out = serde_json::to_string_pretty(&as_json).expect("json") + "\n";
    }
    out
}
