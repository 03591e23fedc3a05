//! The rule engine: the OOM checklist as data. Each `rules/*.toml` file holds one rule — id, title, and one or
//! more cases, each with a severity, a `when` expression over named facts, a message template quoting the
//! evidence, and the fix. Built-in rules are embedded at build time; `--rules DIR` adds or overrides.

pub mod expr;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::analysis::facts::{Fact, Facts};
use crate::analysis::Finding;
use expr::{Expr, Val};

include!(concat!(env!("OUT_DIR"), "/builtin_rules.rs"));

pub use crate::analysis::Severity;

#[derive(Clone, Debug)]
pub struct Case {
    pub severity: Severity,
    pub when: Expr,
    pub when_src: String,
    pub message: String,
    pub fix: String,
    /// Facts quoted as evidence (besides those the condition reads).
    pub evidence: Vec<String>,
    /// Rules with `each`: the class this case gives the items it matches (`memory-bound`).
    pub label: Option<String>,
    /// Rules with `each`: how one item reads in the finding's `{group.list}`.
    pub item: Option<String>,
    /// The memory this cause accounts for (`bytes = "leak.growth_bytes"`), by which the verdict ranks causes;
    /// none where no size applies (churn, kernel limits).
    pub bytes: Option<Expr>,
}

#[derive(Clone, Debug)]
pub struct Rule {
    pub id: String,
    pub title: String,
    /// What the rule checks and why, for `oomdoc explain`.
    pub explain: String,
    pub references: Vec<String>,
    pub cases: Vec<Case>,
    /// Evaluated once per item of this collection (`kernel`: each Nsight Compute launch) instead of once per
    /// device; the items one case matches make one finding.
    pub each: Option<String>,
    /// Rules with `each`: the item fact that orders the items of a finding, largest first.
    pub rank: Option<String>,
    /// Rules whose findings on the same GPU outrank this one's in the verdict, whatever the bytes: a cause that is
    /// only the last straw (fragmentation) yields to one that filled the memory (a leak, a growing cache).
    pub yields_to: Vec<String>,
    /// Where it came from: `built-in rules/x.toml` or a path.
    pub source: String,
}

/// The collections a rule can name in `each`, and the fact that names an item.
pub const COLLECTIONS: &[(&str, &str)] = &[("kernel", "kernel.short_name")];

/// Items of a collection a finding quotes in its evidence.
const GROUP_EVIDENCE_ITEMS: usize = 10;
/// Items of a collection a finding's `{group.list}` names.
const GROUP_LIST_ITEMS: usize = 5;

/// A rule file that cannot be used: `file:line:col: what was expected`.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}:{col}: {message}")]
pub struct RuleError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    title: String,
    #[serde(default)]
    explain: String,
    #[serde(default)]
    references: Vec<String>,
    #[serde(default)]
    severity: Option<toml::Spanned<String>>,
    #[serde(default)]
    when: Option<toml::Spanned<String>>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    fix: Option<String>,
    #[serde(default)]
    evidence: Vec<String>,
    #[serde(default)]
    bytes: Option<toml::Spanned<String>>,
    #[serde(default, rename = "case")]
    cases: Vec<RawCase>,
    #[serde(default)]
    each: Option<toml::Spanned<String>>,
    #[serde(default)]
    rank: Option<String>,
    #[serde(default)]
    yields_to: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    severity: toml::Spanned<String>,
    when: toml::Spanned<String>,
    message: String,
    fix: String,
    #[serde(default)]
    evidence: Vec<String>,
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    item: Option<String>,
    #[serde(default)]
    bytes: Option<toml::Spanned<String>>,
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    // An offset inside an expression counts the string's characters after TOML unescaping, so it may not land on
    // a character boundary of the file: round down to one.
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.chars().count(), |nl| before[nl + 1..].chars().count()) + 1;
    (line, col)
}

/// Where the text of a TOML string value starts, given the span of its literal.
fn content_start(text: &str, span_start: usize) -> usize {
    let Some(lit) = text.get(span_start..) else { return span_start };
    if lit.starts_with("\"\"\"") || lit.starts_with("'''") {
        let after = span_start + 3;
        // A newline right after the opening quotes is not part of the string.
        let rest = text.get(after..).unwrap_or("");
        if rest.starts_with('\n') {
            after + 1
        } else if rest.starts_with("\r\n") {
            after + 2
        } else {
            after
        }
    } else {
        span_start + 1
    }
}

/// Parses one rule file.
pub fn parse_rule(file: &str, text: &str) -> Result<Rule, RuleError> {
    let err_at = |offset: usize, message: String| {
        let (line, col) = line_col(text, offset);
        RuleError { file: file.to_string(), line, col, message }
    };
    let raw: RawRule = toml::from_str(text).map_err(|e| {
        let off = e.span().map_or(0, |s| s.start);
        err_at(off, e.message().trim().to_string())
    })?;
    let parse_expr = |src: &toml::Spanned<String>| {
        expr::parse(src.get_ref()).map_err(|e| err_at(content_start(text, src.span().start) + e.offset, e.expected))
    };
    let parse_case = |severity: &toml::Spanned<String>,
                      when: &toml::Spanned<String>,
                      message: String,
                      fix: String,
                      evidence: Vec<String>,
                      bytes: Option<&toml::Spanned<String>>|
     -> Result<Case, RuleError> {
        let sev = Severity::parse(severity.get_ref()).ok_or_else(|| {
            err_at(
                severity.span().start,
                format!("expected severity \"error\", \"warning\" or \"info\", found {:?}", severity.get_ref()),
            )
        })?;
        let expr = parse_expr(when)?;
        let bytes = bytes.map(parse_expr).transpose()?;
        check_template(&message).map_err(|m| err_at(0, format!("message: {m}")))?;
        check_template(&fix).map_err(|m| err_at(0, format!("fix: {m}")))?;
        Ok(Case {
            severity: sev,
            when: expr,
            when_src: when.get_ref().clone(),
            message,
            fix,
            evidence,
            label: None,
            item: None,
            bytes,
        })
    };
    let mut cases = Vec::new();
    match (&raw.severity, &raw.when) {
        (Some(sev), Some(when)) => {
            let message = raw.message.clone().ok_or_else(|| err_at(0, "missing 'message'".into()))?;
            let fix = raw.fix.clone().ok_or_else(|| err_at(0, "missing 'fix'".into()))?;
            cases.push(parse_case(sev, when, message, fix, raw.evidence.clone(), raw.bytes.as_ref())?);
        }
        (None, None) => {}
        _ => return Err(err_at(0, "a rule needs both 'severity' and 'when' (or [[case]] tables)".into())),
    }
    for c in raw.cases {
        // A case's own `bytes`, else the rule's.
        let bytes = c.bytes.as_ref().or(raw.bytes.as_ref());
        let mut case = parse_case(&c.severity, &c.when, c.message, c.fix, c.evidence, bytes)?;
        if let Some(item) = &c.item {
            check_template(item).map_err(|m| err_at(0, format!("item: {m}")))?;
        }
        case.label = c.label;
        case.item = c.item;
        cases.push(case);
    }
    if let Some(each) = &raw.each {
        if !COLLECTIONS.iter().any(|(c, _)| c == each.get_ref()) {
            let known: Vec<&str> = COLLECTIONS.iter().map(|(c, _)| *c).collect();
            return Err(err_at(
                each.span().start,
                format!("expected 'each' to name a collection ({}), found {:?}", known.join(", "), each.get_ref()),
            ));
        }
    }
    if cases.is_empty() {
        return Err(err_at(0, "a rule needs 'severity', 'when', 'message' and 'fix', or [[case]] tables".into()));
    }
    if raw.id.is_empty() || !raw.id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return Err(err_at(0, format!("rule id {:?} must be lowercase letters, digits and '-'", raw.id)));
    }
    Ok(Rule {
        id: raw.id,
        title: raw.title,
        explain: raw.explain,
        references: raw.references,
        cases,
        each: raw.each.map(|e| e.into_inner()),
        rank: raw.rank,
        yields_to: raw.yields_to,
        source: file.to_string(),
    })
}

/// `{fact}` and `{fact|format}` placeholders must be well formed.
fn check_template(t: &str) -> Result<(), String> {
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').ok_or_else(|| format!("unclosed '{{' in {t:?}"))?;
        let inner = &rest[open + 1..open + close];
        let (name, fmt) = inner.split_once('|').unwrap_or((inner, ""));
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            return Err(format!("bad placeholder {{{inner}}}"));
        }
        if !["", "bytes", "pct", "pct1", "count", "num", "s"].contains(&fmt) {
            return Err(format!("unknown format '{fmt}' in {{{inner}}} (use bytes, pct, pct1, count, num or s)"));
        }
        rest = &rest[open + close + 1..];
    }
    Ok(())
}

/// Fills `{fact}` / `{fact|format}` placeholders.
pub fn render_template(t: &str, facts: &Facts) -> String {
    let mut out = String::new();
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else { break };
        let inner = &rest[open + 1..open + close];
        let (name, fmt) = inner.split_once('|').unwrap_or((inner, ""));
        out.push_str(&match facts.get(name) {
            Some(f) => f.display(fmt),
            None => "(unknown)".to_string(),
        });
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The rule set in force: built-ins, then user rules by id.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
}

impl RuleSet {
    pub fn builtin() -> RuleSet {
        let mut rules: Vec<Rule> = BUILTIN_RULES
            .iter()
            .filter(|(name, _)| *name != "categories.toml")
            .map(|(name, text)| {
                parse_rule(&format!("rules/{name}"), text).unwrap_or_else(|e| panic!("built-in rule broken: {e}"))
            })
            .collect();
        for r in &mut rules {
            r.source = format!("built-in {}", r.source);
        }
        RuleSet { rules }
    }

    /// Adds every `*.toml` in `dir` (except `categories.toml`); a rule with a built-in's id replaces it.
    pub fn extend_from_dir(&mut self, dir: &Path) -> Result<(), crate::Error> {
        let read_err = |e: std::io::Error| crate::Error::Io { path: dir.display().to_string(), source: e };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .filter(|p| p.file_name().is_some_and(|n| n != "categories.toml"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| crate::Error::Io { path: f.display().to_string(), source: e })?;
            let rule = parse_rule(&f.display().to_string(), &text)?;
            match self.rules.iter_mut().find(|r| r.id == rule.id) {
                Some(r) => *r = rule,
                None => self.rules.push(rule),
            }
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.id == id)
    }

    /// Runs every rule on one device's facts.
    pub fn evaluate(&self, device: Option<i64>, facts: &Facts) -> Vec<Finding> {
        let lookup = |name: &str| facts.get(name).map_or(Val::Missing, |f| f.value.clone());
        let mut out = Vec::new();
        for rule in self.rules.iter().filter(|r| r.each.is_none()) {
            let Some(case) = rule.cases.iter().find(|c| expr::eval(&c.when, &lookup).truthy()) else { continue };
            let mut names = Vec::new();
            expr::facts(&case.when, &mut names);
            names.extend(case.evidence.iter().cloned());
            // The line each subject of the evidence points at (`leak.caller` beside `leak.stacks`): what a job view
            // merges ranks by, and what a reader of the JSON wants next to the numbers.
            let subjects: std::collections::BTreeSet<String> =
                names.iter().filter_map(|n| n.split_once('.').map(|(s, _)| s.to_string())).collect();
            names.extend(subjects.iter().flat_map(|s| [format!("{s}.caller"), format!("{s}.where")]));
            let mut evidence = BTreeMap::new();
            for n in names {
                if let Some(f) = facts.get(&n) {
                    evidence.insert(n, f.to_json());
                }
            }
            out.push(Finding {
                rule: rule.id.clone(),
                severity: case.severity,
                device,
                bytes: explained_bytes(case, &lookup),
                title: rule.title.clone(),
                message: render_template(&case.message, facts),
                evidence: serde_json::to_value(evidence).expect("json"),
                fix: render_template(&case.fix, facts),
                references: rule.references.clone(),
            });
        }
        out
    }
}

/// What rules with `each` found over one collection.
#[derive(Debug, Default)]
pub struct EachOutcome {
    pub findings: Vec<Finding>,
    /// Per item, the label of the first labelled case that matched it (rules in order).
    pub labels: Vec<Option<String>>,
}

impl RuleSet {
    /// Runs the rules with `each = collection` over its items: each item's facts, with the job's facts behind
    /// them. The items one case matches make one finding: its message sees the top item's facts (by the rule's
    /// `rank`) and `group.count`, `group.of`, `group.list`.
    pub fn evaluate_each(&self, collection: &str, items: &[Facts], job: &Facts) -> EachOutcome {
        let mut out = EachOutcome { findings: Vec::new(), labels: vec![None; items.len()] };
        let name_fact = COLLECTIONS.iter().find(|(c, _)| *c == collection).map_or("", |(_, n)| n);
        for rule in self.rules.iter().filter(|r| r.each.as_deref() == Some(collection)) {
            let mut groups: Vec<Vec<usize>> = vec![Vec::new(); rule.cases.len()];
            for (i, item) in items.iter().enumerate() {
                let lookup = |n: &str| item.get(n).or_else(|| job.get(n)).map_or(Val::Missing, |f| f.value.clone());
                if let Some(c) = rule.cases.iter().position(|c| expr::eval(&c.when, &lookup).truthy()) {
                    groups[c].push(i);
                    if out.labels[i].is_none() {
                        out.labels[i] = rule.cases[c].label.clone();
                    }
                }
            }
            for (case, mut members) in rule.cases.iter().zip(groups) {
                if members.is_empty() {
                    continue;
                }
                if let Some(rank) = &rule.rank {
                    let key = |i: &usize| match items[*i].get(rank).map(|f| &f.value) {
                        Some(Val::Num(n)) => *n,
                        _ => f64::NEG_INFINITY,
                    };
                    members.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
                }
                let mut facts = with_job(&items[members[0]], job);
                let item_template = case.item.clone().unwrap_or_else(|| format!("{{{name_fact}}}"));
                let mut list: Vec<String> = members
                    .iter()
                    .take(GROUP_LIST_ITEMS)
                    .map(|&i| render_template(&item_template, &with_job(&items[i], job)))
                    .collect();
                if members.len() > GROUP_LIST_ITEMS {
                    list.push(format!("and {} more", members.len() - GROUP_LIST_ITEMS));
                }
                let doc = "items this case matched";
                facts.num("group.count", members.len() as f64, crate::analysis::facts::Unit::Count, doc);
                facts.num("group.of", items.len() as f64, crate::analysis::facts::Unit::Count, "items evaluated");
                facts.text("group.list", list.join("; "), "the top items, as the case's `item` template reads");
                let mut names = Vec::new();
                expr::facts(&case.when, &mut names);
                names.extend(case.evidence.iter().cloned());
                names.insert(0, name_fact.to_string());
                names.extend(rule.rank.iter().cloned());
                let mut seen = std::collections::HashSet::new();
                names.retain(|n| seen.insert(n.clone()));
                let quoted: Vec<serde_json::Value> = members
                    .iter()
                    .take(GROUP_EVIDENCE_ITEMS)
                    .map(|&i| {
                        let mut m = BTreeMap::new();
                        for n in &names {
                            if let Some(f) = items[i].get(n).or_else(|| job.get(n)) {
                                m.insert(n.clone(), f.to_json());
                            }
                        }
                        serde_json::to_value(m).expect("json")
                    })
                    .collect();
                let lookup = |n: &str| facts.get(n).map_or(Val::Missing, |f| f.value.clone());
                let bytes = explained_bytes(case, &lookup);
                out.findings.push(Finding {
                    rule: rule.id.clone(),
                    severity: case.severity,
                    device: None,
                    bytes,
                    title: match &case.label {
                        Some(l) => format!("{} — {l}", rule.title),
                        None => rule.title.clone(),
                    },
                    message: render_template(&case.message, &facts),
                    evidence: serde_json::json!({
                        "count": members.len(),
                        "of": items.len(),
                        format!("{collection}s"): quoted,
                    }),
                    fix: render_template(&case.fix, &facts),
                    references: rule.references.clone(),
                });
            }
        }
        out
    }
}

impl RuleSet {
    /// Runs every rule on an analysis: per device, on the job's facts, over each collection; records the classes
    /// the `each` rules gave, and sorts the findings most important first.
    pub fn apply(&self, a: &mut crate::analysis::Analysis) {
        for d in &a.devices {
            a.findings.extend(self.evaluate(Some(d.device), &d.facts));
        }
        a.findings.extend(self.evaluate(None, &a.job_facts));
        let kernels = self.evaluate_each("kernel", &a.kernel_facts, &a.job_facts);
        a.findings.extend(kernels.findings);
        if let Some(p) = &mut a.profile {
            p.set_ncu_classes(&kernels.labels);
        }
        let yields = |id: &str| self.rules.iter().find(|r| r.id == id).map_or(Vec::new(), |r| r.yields_to.clone());
        crate::analysis::verdict::attach(a, &yields);
    }
}

/// What a case's `bytes` expression gives: a size in bytes, or none where it is missing or not a size.
fn explained_bytes(case: &Case, lookup: &dyn Fn(&str) -> Val) -> Option<u64> {
    match expr::eval(case.bytes.as_ref()?, lookup) {
        Val::Num(n) if n.is_finite() && n >= 0.0 => Some(n.min(u64::MAX as f64) as u64),
        _ => None,
    }
}

/// One item's facts with the job's behind them (the item's win).
fn with_job(item: &Facts, job: &Facts) -> Facts {
    let mut f = job.clone();
    for (k, v) in item.iter() {
        f.insert(k, v.clone());
    }
    f
}

pub use crate::analysis::sort_findings;

impl Fact {
    fn to_json(&self) -> serde_json::Value {
        match &self.value {
            Val::Num(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => serde_json::json!(*n as i64),
            Val::Num(n) => serde_json::json!(n),
            Val::Bool(b) => serde_json::json!(b),
            Val::Str(s) => serde_json::json!(s),
            Val::Missing => serde_json::Value::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_rules_parse() {
        let rs = RuleSet::builtin();
        for id in [
            "fragmentation",
            "leaked-references",
            "missing-no-sync",
            "unbounded-kv-growth",
            "nccl-overhead",
            "compile-warmup",
            "large-intermediate",
        ] {
            assert!(rs.get(id).is_some(), "{id} missing");
        }
    }

    #[test]
    fn bad_rule_files_point_at_the_spot() {
        let text = "id = \"x\"\ntitle = \"t\"\nseverity = \"error\"\nwhen = \"oom.present and\"\nmessage = \"m\"\nfix = \"f\"\n";
        let e = parse_rule("my.toml", text).unwrap_err();
        assert_eq!((e.line, e.col), (4, 24), "{e}");
        assert!(e.to_string().starts_with("my.toml:4:24: expected"), "{e}");
        let e = parse_rule("my.toml", "id = \"x\"\ntitle = 3\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let text = "id = \"x\"\ntitle = \"t\"\nseverity = \"fatal\"\nwhen = \"true\"\nmessage = \"m\"\nfix = \"f\"\n";
        let e = parse_rule("my.toml", text).unwrap_err();
        assert!(e.to_string().contains("my.toml:3:12: expected severity"), "{e}");
        let text = "id = \"x\"\ntitle = \"t\"\nseverity = \"info\"\nwhen = \"\"\"\n  a >\n  \"\"\"\nmessage = \"m\"\nfix = \"f\"\n";
        let e = parse_rule("my.toml", text).unwrap_err();
        assert_eq!(e.line, 5, "{e}");
    }
}
