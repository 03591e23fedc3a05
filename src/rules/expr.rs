//! The `when` language of rule files: arithmetic and comparisons over named facts.
//!
//! ```text
//! expr    := or
//! or      := and ("or" and)*
//! and     := not ("and" not)*
//! not     := "not" not | cmp
//! cmp     := sum (("<=" | ">=" | "==" | "!=" | "<" | ">") sum)?
//! sum     := product (("+" | "-") product)*
//! product := unary (("*" | "/") unary)*
//! unary   := "-" unary | atom
//! atom    := number unit? | "true" | "false" | string | path | "(" expr ")"
//! unit    := B | KB | MB | GB | TB | KiB | MiB | GiB | TiB | %
//! path    := name ("." name)*          e.g. oom.requested_bytes
//! ```
//!
//! A fact that is not known for the device evaluates to *missing*; anything computed from a missing value is
//! missing, and a rule whose condition is missing does not fire. So a rule never fires on a file that lacks the
//! evidence it needs.

use nom::branch::alt;
use nom::bytes::complete::{is_not, tag, take_while};
use nom::character::complete::{char, multispace0, satisfy};
use nom::combinator::{all_consuming, cut, map, opt, recognize};
use nom::error::{context, VerboseError, VerboseErrorKind};
use nom::multi::many0;
use nom::number::complete::recognize_float;
use nom::sequence::{delimited, pair, preceded, tuple};
use nom::IResult;

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Num(f64),
    Bool(bool),
    Str(String),
    Fact(String),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Bin(Op, Box<Expr>, Box<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Or,
    And,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    Add,
    Sub,
    Mul,
    Div,
}

pub use crate::analysis::facts::Val;

/// A parse error: where (0-based byte offset into the expression) and what was expected.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub offset: usize,
    pub expected: String,
}

type Res<'a, T> = IResult<&'a str, T, VerboseError<&'a str>>;

fn ws<'a, T>(inner: impl FnMut(&'a str) -> Res<'a, T>) -> impl FnMut(&'a str) -> Res<'a, T> {
    delimited(multispace0, inner, multispace0)
}

/// A keyword that is not the prefix of a longer name (`and` but not `android`).
fn keyword<'a>(word: &'static str) -> impl FnMut(&'a str) -> Res<'a, &'a str> {
    move |i: &'a str| {
        let (rest, k) = tag(word)(i)?;
        if rest.chars().next().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return Err(nom::Err::Error(VerboseError { errors: vec![(i, VerboseErrorKind::Context("keyword"))] }));
        }
        Ok((rest, k))
    }
}

fn number(i: &str) -> Res<'_, Expr> {
    let (i, n) = recognize_float(i)?;
    let v: f64 = n
        .parse()
        .map_err(|_| nom::Err::Failure(VerboseError { errors: vec![(i, VerboseErrorKind::Context("a number"))] }))?;
    let (i, unit) = opt(alt((
        tag("KiB"),
        tag("MiB"),
        tag("GiB"),
        tag("TiB"),
        tag("KB"),
        tag("MB"),
        tag("GB"),
        tag("TB"),
        tag("B"),
        tag("%"),
    )))(i)?;
    let scale = match unit {
        None | Some("B") => 1.0,
        Some("KiB") => 1024.0,
        Some("MiB") => 1024.0 * 1024.0,
        Some("GiB") => 1024.0 * 1024.0 * 1024.0,
        Some("TiB") => 1024.0f64.powi(4),
        Some("KB") => 1e3,
        Some("MB") => 1e6,
        Some("GB") => 1e9,
        Some("TB") => 1e12,
        Some("%") => 0.01,
        Some(_) => unreachable!("every unit listed"),
    };
    Ok((i, Expr::Num(v * scale)))
}

fn name(i: &str) -> Res<'_, &str> {
    recognize(pair(
        satisfy(|c| c.is_ascii_alphabetic() || c == '_'),
        take_while(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
    ))(i)
}

fn path(i: &str) -> Res<'_, Expr> {
    map(recognize(pair(name, many0(pair(char('.'), cut(name))))), |p: &str| match p {
        "true" => Expr::Bool(true),
        "false" => Expr::Bool(false),
        _ => Expr::Fact(p.to_string()),
    })(i)
}

fn string(i: &str) -> Res<'_, Expr> {
    let dq = delimited(char('"'), opt(is_not("\"")), cut(char('"')));
    let sq = delimited(char('\''), opt(is_not("'")), cut(char('\'')));
    map(alt((dq, sq)), |s: Option<&str>| Expr::Str(s.unwrap_or("").to_string()))(i)
}

fn atom(i: &str) -> Res<'_, Expr> {
    ws(context(
        "a number, a fact name, a string or '('",
        alt((number, string, path, delimited(char('('), expr, context("')'", cut(char(')')))))),
    ))(i)
}

fn unary(i: &str) -> Res<'_, Expr> {
    alt((map(preceded(ws(char('-')), cut(unary)), |e| Expr::Neg(Box::new(e))), atom))(i)
}

fn fold(first: Expr, rest: Vec<(Op, Expr)>) -> Expr {
    rest.into_iter().fold(first, |acc, (op, e)| Expr::Bin(op, Box::new(acc), Box::new(e)))
}

fn product(i: &str) -> Res<'_, Expr> {
    let (i, first) = unary(i)?;
    let op = ws(alt((map(char('*'), |_| Op::Mul), map(char('/'), |_| Op::Div))));
    let (i, rest) = many0(pair(op, cut(unary)))(i)?;
    Ok((i, fold(first, rest)))
}

fn sum(i: &str) -> Res<'_, Expr> {
    let (i, first) = product(i)?;
    let op = ws(alt((map(char('+'), |_| Op::Add), map(char('-'), |_| Op::Sub))));
    let (i, rest) = many0(pair(op, cut(product)))(i)?;
    Ok((i, fold(first, rest)))
}

fn cmp(i: &str) -> Res<'_, Expr> {
    let (i, first) = sum(i)?;
    let op = ws(alt((
        map(tag("<="), |_| Op::Le),
        map(tag(">="), |_| Op::Ge),
        map(tag("=="), |_| Op::Eq),
        map(tag("!="), |_| Op::Ne),
        map(tag("<"), |_| Op::Lt),
        map(tag(">"), |_| Op::Gt),
    )));
    let (i, rest) = opt(pair(op, cut(sum)))(i)?;
    Ok((
        i,
        match rest {
            Some((op, e)) => Expr::Bin(op, Box::new(first), Box::new(e)),
            None => first,
        },
    ))
}

fn not(i: &str) -> Res<'_, Expr> {
    alt((map(preceded(ws(keyword("not")), cut(not)), |e| Expr::Not(Box::new(e))), cmp))(i)
}

fn and(i: &str) -> Res<'_, Expr> {
    let (i, first) = not(i)?;
    let (i, rest) = many0(pair(map(ws(keyword("and")), |_| Op::And), cut(not)))(i)?;
    Ok((i, fold(first, rest)))
}

fn expr(i: &str) -> Res<'_, Expr> {
    let (i, first) = and(i)?;
    let (i, rest) = many0(pair(map(ws(keyword("or")), |_| Op::Or), cut(and)))(i)?;
    Ok((i, fold(first, rest)))
}

/// Parses a `when` expression.
pub fn parse(src: &str) -> Result<Expr, ParseError> {
    let trailing = |i| -> Res<'_, ()> {
        let (i, _) = multispace0(i)?;
        if i.is_empty() {
            Ok((i, ()))
        } else {
            Err(nom::Err::Error(VerboseError {
                errors: vec![(i, VerboseErrorKind::Context("an operator (and, or, <, +, …) or the end"))],
            }))
        }
    };
    match all_consuming(tuple((expr, trailing)))(src) {
        Ok((_, (e, ()))) => Ok(e),
        Err(nom::Err::Error(e)) | Err(nom::Err::Failure(e)) => {
            // The deepest position reached says the most; prefer a named expectation there.
            let (at, kind) = e
                .errors
                .iter()
                .min_by_key(|(rest, kind)| (rest.len(), !matches!(kind, VerboseErrorKind::Context(_))))
                .cloned()
                .unwrap_or((src, VerboseErrorKind::Context("an expression")));
            let expected = match kind {
                VerboseErrorKind::Context(c) => c.to_string(),
                VerboseErrorKind::Char(c) => format!("'{c}'"),
                VerboseErrorKind::Nom(_) => "an expression".to_string(),
            };
            let found = if at.trim().is_empty() {
                "the end of the expression".to_string()
            } else {
                format!("{:?}", at.trim_start().chars().take(12).collect::<String>())
            };
            // At the end of the text, point just past its last token rather than at trailing whitespace.
            let offset = if at.trim().is_empty() {
                src.trim_end().len()
            } else {
                src.len() - at.trim_start().len().min(src.len())
            };
            Err(ParseError { offset: offset.min(src.len()), expected: format!("expected {expected}, found {found}") })
        }
        Err(nom::Err::Incomplete(_)) => Err(ParseError { offset: src.len(), expected: "more input".into() }),
    }
}

/// Names of every fact an expression reads.
pub fn facts(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Fact(f) => out.push(f.clone()),
        Expr::Not(a) | Expr::Neg(a) => facts(a, out),
        Expr::Bin(_, a, b) => {
            facts(a, out);
            facts(b, out);
        }
        _ => {}
    }
}

/// Evaluates against a fact lookup.
pub fn eval(e: &Expr, lookup: &dyn Fn(&str) -> Val) -> Val {
    match e {
        Expr::Num(n) => Val::Num(*n),
        Expr::Bool(b) => Val::Bool(*b),
        Expr::Str(s) => Val::Str(s.clone()),
        Expr::Fact(f) => lookup(f),
        Expr::Not(a) => match eval(a, lookup) {
            Val::Missing => Val::Missing,
            v => Val::Bool(!v.truthy()),
        },
        Expr::Neg(a) => match eval(a, lookup) {
            Val::Num(n) => Val::Num(-n),
            _ => Val::Missing,
        },
        Expr::Bin(Op::And, a, b) => {
            let l = eval(a, lookup);
            if l != Val::Missing && !l.truthy() {
                return Val::Bool(false);
            }
            match (l, eval(b, lookup)) {
                (Val::Missing, _) | (_, Val::Missing) => Val::Missing,
                (_, r) => Val::Bool(r.truthy()),
            }
        }
        Expr::Bin(Op::Or, a, b) => {
            let l = eval(a, lookup);
            if l.truthy() {
                return Val::Bool(true);
            }
            match eval(b, lookup) {
                r if r.truthy() => Val::Bool(true),
                Val::Missing => Val::Missing,
                _ if l == Val::Missing => Val::Missing,
                _ => Val::Bool(false),
            }
        }
        Expr::Bin(op, a, b) => {
            let (l, r) = (eval(a, lookup), eval(b, lookup));
            match (op, l, r) {
                (_, Val::Missing, _) | (_, _, Val::Missing) => Val::Missing,
                (Op::Eq, l, r) => Val::Bool(l == r),
                (Op::Ne, l, r) => Val::Bool(l != r),
                (op, Val::Num(x), Val::Num(y)) => match op {
                    Op::Lt => Val::Bool(x < y),
                    Op::Le => Val::Bool(x <= y),
                    Op::Gt => Val::Bool(x > y),
                    Op::Ge => Val::Bool(x >= y),
                    Op::Add => Val::Num(x + y),
                    Op::Sub => Val::Num(x - y),
                    Op::Mul => Val::Num(x * y),
                    Op::Div if y == 0.0 => Val::Missing,
                    Op::Div => Val::Num(x / y),
                    _ => unreachable!("logical ops handled above"),
                },
                _ => Val::Missing,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(src: &str, facts: &[(&str, Val)]) -> Val {
        let e = parse(src).unwrap_or_else(|e| panic!("{src}: {e:?}"));
        eval(&e, &|name| facts.iter().find(|(n, _)| *n == name).map_or(Val::Missing, |(_, v)| v.clone()))
    }

    #[test]
    fn units_precedence_and_logic() {
        assert_eq!(ev("1GiB == 1024 * 1MiB", &[]), Val::Bool(true));
        assert_eq!(ev("2 + 3 * 4", &[]), Val::Num(14.0));
        assert_eq!(ev("(2 + 3) * 4", &[]), Val::Num(20.0));
        assert_eq!(ev("50% == 0.5", &[]), Val::Bool(true));
        assert_eq!(ev("-1 < 0 and not false", &[]), Val::Bool(true));
        assert_eq!(ev("1.5e3 > 1KB or x", &[]), Val::Bool(true));
    }

    #[test]
    fn facts_and_missing() {
        let f = [("oom.requested_bytes", Val::Num(2e9)), ("cache.free_bytes", Val::Num(6e9))];
        assert_eq!(ev("oom.requested_bytes <= cache.free_bytes", &f), Val::Bool(true));
        assert_eq!(ev("oom.requested_bytes > unknown.fact", &f), Val::Missing);
        assert!(!ev("not unknown.fact", &f).truthy());
        // A false left side decides `and` even if the right is missing.
        assert_eq!(ev("oom.requested_bytes > 1TB and unknown.fact", &f), Val::Bool(false));
        assert_eq!(
            ev("settings.mode == \"expandable\"", &[("settings.mode", Val::Str("expandable".into()))]),
            Val::Bool(true)
        );
        // `android` is a name, not `and` followed by `roid`.
        assert_eq!(ev("android > 1", &[("android", Val::Num(2.0))]), Val::Bool(true));
    }

    #[test]
    fn errors_say_where_and_what() {
        let e = parse("oom.requested_bytes <= ").unwrap_err();
        assert_eq!(e.offset, 22, "{e:?}");
        assert!(e.expected.contains("expected a number, a fact name"), "{e:?}");
        let e = parse("a > 1 b").unwrap_err();
        assert_eq!(e.offset, 6, "{e:?}");
        assert!(e.expected.contains("an operator"), "{e:?}");
        let e = parse("(a > 1").unwrap_err();
        assert!(e.expected.contains("')'"), "{e:?}");
        let e = parse("a.").unwrap_err();
        assert_eq!(e.offset, 2, "{e:?}");
    }
}
