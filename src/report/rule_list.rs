//! `oomdoc rules` and `oomdoc explain`: the checklist in force, and one rule in full.

use crate::rules::RuleSet;
use crate::Error;

/// One line per rule: its id, its severities, its title.
pub fn list(rules: &RuleSet) -> String {
    let mut out = String::new();
    for r in &rules.rules {
        let sev: Vec<&str> = r.cases.iter().map(|c| c.severity.name()).collect();
        out.push_str(&format!("{:<20} {:<16} {}\n", r.id, sev.join("/"), r.title));
    }
    out.push_str("\n`oomdoc explain RULE` says what a rule checks and why.\n");
    out
}

/// What rule `id` checks, why, when each of its cases fires and what it suggests.
pub fn explain(rules: &RuleSet, id: &str) -> Result<String, Error> {
    let r = rules.get(id).ok_or_else(|| {
        let ids: Vec<&str> = rules.rules.iter().map(|r| r.id.as_str()).collect();
        Error::Usage(format!("no rule {id:?}; the rules are: {}", ids.join(", ")))
    })?;
    let mut out = format!("{} — {}\n\n{}\n", r.id, r.title, r.explain.trim());
    for c in &r.cases {
        out.push_str(&format!(
            "\n{} when:\n  {}\nfix:\n  {}\n",
            c.severity.name(),
            c.when_src.split_whitespace().collect::<Vec<_>>().join(" "),
            c.fix
        ));
    }
    if !r.references.is_empty() {
        out.push_str("\nReferences:\n");
        for link in &r.references {
            out.push_str(&format!("  {link}\n"));
        }
    }
    out.push_str(&format!("\nDefined in {}.\n", r.source));
    Ok(out)
}
