//! What every text artifact needs: lines (LF, CRLF, stray CR), byte sizes with their units, wall-clock stamps,
//! and the launcher/logger prefixes that multi-process jobs glue to each line.

use std::sync::OnceLock;

use regex::Regex;

use crate::timeline::Stamp;

/// Lines with their 1-based numbers. A trailing CR (Windows captures) is dropped and ANSI colour codes are
/// removed, so parsers see what a terminal showed.
pub fn lines(text: &str) -> impl Iterator<Item = (usize, String)> + '_ {
    text.split('\n').enumerate().map(|(i, l)| (i + 1, strip_ansi(l.strip_suffix('\r').unwrap_or(l))))
}

/// Removes `ESC [ ... letter` sequences (colour, underline) that `nvidia-smi topo` and coloured loggers write.
pub fn strip_ansi(s: &str) -> String {
    if !s.contains('\u{1b}') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Bytes per unit. Binary units (KiB, MiB …, and the bare `B`/`bytes`) are powers of 1024; SI units (KB, MB,
/// GB …) are powers of 1000, as SI defines them. Single letters (`K`, `M`, `G`, TensorFlow's `17.79G`) are the
/// binary units: TensorFlow prints them next to the exact byte count, which is binary-consistent.
pub fn unit_scale(unit: &str) -> Option<u128> {
    let u = unit.trim();
    let bin = |p: u32| Some(1u128 << (10 * p));
    let dec = |p: u32| Some(10u128.pow(3 * p));
    match u {
        "B" | "b" | "byte" | "bytes" | "Byte" | "Bytes" => Some(1),
        "KiB" | "kiB" | "K" | "k" => bin(1),
        "MiB" | "M" => bin(2),
        "GiB" | "G" => bin(3),
        "TiB" | "T" => bin(4),
        "PiB" | "P" => bin(5),
        "EiB" | "E" => bin(6),
        "KB" | "kB" | "kb" | "Kb" => dec(1),
        "MB" | "mb" => dec(2),
        "GB" | "gb" => dec(3),
        "TB" | "tb" => dec(4),
        "PB" => dec(5),
        "EB" => dec(6),
        _ => None,
    }
}

/// `"12.50"` + `"MiB"` → 13107200. Exact decimal arithmetic (no float): the text's digits times the unit,
/// rounded to the nearest byte (half up). Thousands separators (`178,880`) are accepted.
pub fn parse_size(number: &str, unit: &str) -> Option<u64> {
    let scale = unit_scale(unit)?;
    let (mantissa, decimals) = parse_decimal(number)?;
    let den = 10u128.checked_pow(decimals)?;
    let num = mantissa.checked_mul(scale)?;
    u64::try_from((num + den / 2) / den).ok()
}

/// A non-negative decimal as (digits, number of decimals): `"1,234.50"` → (123450, 2).
pub fn parse_decimal(s: &str) -> Option<(u128, u32)> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let (mut mantissa, mut decimals, mut seen_dot, mut digits) = (0u128, 0u32, false, 0);
    for c in s.chars() {
        match c {
            '0'..='9' => {
                mantissa = mantissa.checked_mul(10)?.checked_add(c as u128 - '0' as u128)?;
                digits += 1;
                if seen_dot {
                    decimals += 1;
                }
            }
            '.' if !seen_dot => seen_dot = true,
            ',' if !seen_dot => {}
            _ => return None,
        }
    }
    (digits > 0).then_some((mantissa, decimals))
}

/// A plain decimal number (`"95.9"`, `"1,055.3"`) as f64.
pub fn parse_f64(s: &str) -> Option<f64> {
    let (m, d) = parse_decimal(s)?;
    Some(m as f64 / 10f64.powi(d as i32))
}

/// Days from 1970-01-01 to the Julian day number of the same date.
const UNIX_JULIAN_DAY: i64 = 2_440_588;

/// Wall-clock µs "since 1970-01-01 00:00" of the clock that wrote it (no zone applied); `None` for a date or time
/// that does not exist.
pub fn wall_us(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32, frac_us: i64) -> Option<i64> {
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let month = time::Month::try_from(u8::try_from(mo).ok()?).ok()?;
    let date = time::Date::from_calendar_date(i32::try_from(y).ok()?, month, u8::try_from(d).ok()?).ok()?;
    let days = i64::from(date.to_julian_day()) - UNIX_JULIAN_DAY;
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + s);
    Some(secs * 1_000_000 + frac_us)
}

/// Formats wall-clock µs as `2026-07-14 08:12:53.353`.
pub fn format_wall(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let ms = us.rem_euclid(1_000_000) / 1000;
    let t = secs.rem_euclid(86_400);
    let day =
        i32::try_from(secs.div_euclid(86_400) + UNIX_JULIAN_DAY).ok().and_then(|j| time::Date::from_julian_day(j).ok());
    let date = match day {
        Some(d) => format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day()),
        None => "????-??-??".to_string(),
    };
    format!("{date} {:02}:{:02}:{:02}.{ms:03}", t / 3600, t / 60 % 60, t % 60)
}

fn frac_to_us(frac: &str) -> i64 {
    let digits: String = frac.chars().take(6).collect();
    let n: i64 = digits.parse().unwrap_or(0);
    n * 10i64.pow(6 - digits.len() as u32)
}

fn month_number(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    MONTHS.iter().position(|m| name.eq_ignore_ascii_case(m)).map(|i| i as u32 + 1)
}

/// A regex compiled once, on first use, into `cell` (the text readers' one way to hold their patterns).
pub(crate) fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("valid regex"))
}

/// The first date-and-time in `s`, with where it ends. Forms: `2026/07/14 08:12:53.353` (nvidia-smi),
/// `2026-05-12T08:01:39.331095044Z` / `2024-05-01 10:00:00,123` / `… +02:00` (ISO 8601, loggers), and
/// `Tue Jul 14 08:12:53 2026` (ctime, nvidia-smi's table and -q). A zone, when written, makes it absolute.
pub fn find_stamp(s: &str) -> Option<(Stamp, usize, usize)> {
    static ISO: OnceLock<Regex> = OnceLock::new();
    static CTIME: OnceLock<Regex> = OnceLock::new();
    let iso =
        re(&ISO, r"(\d{4})[-/](\d{2})[-/](\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?(Z|[+-]\d{2}:?\d{2}\b)?");
    let ctime =
        re(&CTIME, r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\b");
    let a = iso.captures(s).and_then(|c| {
        let n = |i: usize| c.get(i).map_or(0, |m| m.as_str().parse::<i64>().unwrap_or(0));
        let us = wall_us(
            n(1),
            n(2) as u32,
            n(3) as u32,
            n(4) as u32,
            n(5) as u32,
            n(6) as u32,
            c.get(7).map_or(0, |m| frac_to_us(m.as_str())),
        )?;
        let whole = c.get(0)?;
        let stamp = match c.get(8).map(|m| m.as_str()) {
            None => Stamp::Local(us),
            Some("Z") => Stamp::Unix(us),
            Some(z) => {
                let sign = if z.starts_with('-') { -1 } else { 1 };
                let digits: String = z.chars().filter(|c| c.is_ascii_digit()).collect();
                let (h, m) = (digits[..2].parse::<i64>().ok()?, digits[2..].parse::<i64>().ok()?);
                Stamp::Unix(us - sign * (h * 3600 + m * 60) * 1_000_000)
            }
        };
        Some((stamp, whole.start(), whole.end()))
    });
    let b = ctime.captures(s).and_then(|c| {
        let n = |i: usize| c[i].parse::<i64>().unwrap_or(0);
        let us = wall_us(n(6), month_number(&c[1])?, n(2) as u32, n(3) as u32, n(4) as u32, n(5) as u32, 0)?;
        let whole = c.get(0)?;
        Some((Stamp::Local(us), whole.start(), whole.end()))
    });
    match (a, b) {
        (Some(x), Some(y)) => Some(if x.1 <= y.1 { x } else { y }),
        (x, y) => x.or(y),
    }
}

/// Launcher prefixes that say which rank wrote a line, and the rank: torchrun's `[rank3]:` and `[default3]:`,
/// `srun -l`'s `3: `, Open MPI's `[1,3]<stderr>:`, vLLM workers' `(VllmWorker rank=3 pid=…)`. Returns the
/// rank and the line without the prefix.
pub fn split_rank_prefix(line: &str) -> (Option<i64>, &str) {
    static RANK: OnceLock<Regex> = OnceLock::new();
    let r = re(
        &RANK,
        r"^\s*(?:\[(?:rank|Rank|RANK|default) ?(\d+)\]:?|(\d{1,4}):(?: |$)|\[\d+,(\d+)\]<std(?:out|err)>:|\((?:[A-Za-z]+ )?rank=(\d+)[^)]*\))\s?",
    );
    match r.captures(line) {
        Some(c) => {
            let rank = (1..=4).find_map(|i| c.get(i)).and_then(|m| m.as_str().parse().ok());
            (rank, &line[c.get(0).map_or(0, |m| m.end())..])
        }
        None => (None, line),
    }
}

/// A logger's prefix at the start of a line: a timestamp, a level, bracketed fields, `|` separators
/// (`2020-08-06 07:12:50 | WARNING | fairseq.trainer | `, `[2024-05-01 10:00:00,123][INFO] `, `E0514 12:00:00.1 `),
/// and comment markers that pasted logs carry (`# `, `> `). Returns the rest.
pub fn strip_log_prefix(line: &str) -> &str {
    static PREFIX: OnceLock<Regex> = OnceLock::new();
    let r = re(
        &PREFIX,
        r"^(?:\s*(?:\d{4}[-/]\d{2}[-/]\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?|\[[^\]]{1,80}\]|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b|[IWEF]\d{4} \d{2}:\d{2}:\d{2}(?:\.\d+)?(?: +\d+)?|[|:>#-])\s*)+",
    );
    match r.find(line) {
        Some(m) if m.start() == 0 => &line[m.end()..],
        _ => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_binary_and_decimal() {
        assert_eq!(parse_size("12.50", "MiB"), Some(13_107_200));
        assert_eq!(parse_size("1.66", "GiB"), Some(1_782_411_428)); // 1.66 × 2^30 = 1782411427.84
        assert_eq!(parse_size("0", "bytes"), Some(0));
        assert_eq!(parse_size("1024.00", "KiB"), Some(1 << 20));
        assert_eq!(parse_size("13.9476", "GB"), Some(13_947_600_000));
        assert_eq!(parse_size("8.11", "GB"), Some(8_110_000_000));
        assert_eq!(parse_size("500", "KB"), Some(500_000));
        assert_eq!(parse_size("2", "TiB"), Some(2 << 40));
        assert_eq!(parse_size("1", "EiB"), Some(1 << 60));
        assert_eq!(parse_size("1", "EB"), Some(1_000_000_000_000_000_000));
        assert_eq!(parse_size("178,880", "B"), Some(178_880));
        assert_eq!(parse_size("17.79", "G"), Some(19_101_867_049));
        assert_eq!(parse_size("x", "GiB"), None);
        assert_eq!(parse_size("1", "parsecs"), None);
    }

    #[test]
    fn stamps() {
        let (s, _, _) = find_stamp("2026/07/14 08:12:53.353, 0, 19818 MiB").unwrap();
        assert_eq!(s, Stamp::Local(wall_us(2026, 7, 14, 8, 12, 53, 353_000).unwrap()));
        assert_eq!(format_wall(wall_us(2026, 7, 14, 8, 12, 53, 353_000).unwrap()), "2026-07-14 08:12:53.353");
        let (s, _, _) = find_stamp("2026-05-12T08:01:39.331095044Z (APIServer pid=1) INFO").unwrap();
        assert_eq!(s, Stamp::Unix(wall_us(2026, 5, 12, 8, 1, 39, 331_095).unwrap()));
        let (s, _, _) = find_stamp("at 2026-05-12 10:01:39+02:00").unwrap();
        assert_eq!(s, Stamp::Unix(wall_us(2026, 5, 12, 8, 1, 39, 0).unwrap()));
        let (s, _, _) = find_stamp("Tue Jul 14 08:12:53 2026       ").unwrap();
        assert_eq!(s, Stamp::Local(wall_us(2026, 7, 14, 8, 12, 53, 0).unwrap()));
        assert_eq!(wall_us(1970, 1, 1, 0, 0, 0, 0), Some(0));
        assert_eq!(wall_us(2024, 2, 29, 0, 0, 0, 0), Some(1_709_164_800_000_000));
        assert_eq!(wall_us(2023, 2, 29, 0, 0, 0, 0), None, "no such day");
        assert!(find_stamp("no time here").is_none());
    }

    #[test]
    fn prefixes() {
        assert_eq!(split_rank_prefix("[rank3]: torch.OutOfMemoryError: x"), (Some(3), "torch.OutOfMemoryError: x"));
        assert_eq!(split_rank_prefix("[default1]:RuntimeError"), (Some(1), "RuntimeError"));
        assert_eq!(split_rank_prefix("0: Traceback"), (Some(0), "Traceback"));
        assert_eq!(split_rank_prefix("[1,5]<stderr>:x"), (Some(5), "x"));
        assert_eq!(split_rank_prefix("(VllmWorker rank=1 pid=254) torch.Out"), (Some(1), "torch.Out"));
        assert_eq!(split_rank_prefix("RuntimeError: CUDA"), (None, "RuntimeError: CUDA"));
        assert_eq!(split_rank_prefix("12:00:01 x"), (None, "12:00:01 x"));
        assert_eq!(
            strip_log_prefix("2020-08-06 07:12:50 | WARNING | fairseq.trainer | OOM: Ran out"),
            "fairseq.trainer | OOM: Ran out"
        );
        assert_eq!(strip_log_prefix("# allocated; 47.06 MiB free"), "allocated; 47.06 MiB free");
        assert_eq!(strip_log_prefix("[2024-05-01 10:00:00,123][ERROR] which is"), "which is");
        assert_eq!(strip_log_prefix("plain text"), "plain text");
        assert_eq!(strip_ansi("\u{1b}[4mGPU0\u{1b}[0m"), "GPU0");
    }
}
