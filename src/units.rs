//! Numbers for people: bytes in binary units, durations.

/// Formats bytes with binary units, three significant digits: `1.25 GiB`, `512 B`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {}", UNITS[u])
}

/// Formats a signed byte difference: `+1.5 GiB`, `-512 B`.
pub fn signed_bytes(n: i128) -> String {
    let sign = if n < 0 { "-" } else { "+" };
    format!("{sign}{}", bytes(n.unsigned_abs().min(u64::MAX as u128) as u64))
}

/// Formats microseconds as a human duration: `850 µs`, `12.3 ms`, `4.56 s`, `3 min 20 s`.
pub fn duration_us(us: i64) -> String {
    let a = us.unsigned_abs();
    let sign = if us < 0 { "-" } else { "" };
    if a < 1_000 {
        format!("{sign}{a} µs")
    } else if a < 1_000_000 {
        format!("{sign}{:.1} ms", a as f64 / 1e3)
    } else if a < 120_000_000 {
        format!("{sign}{:.2} s", a as f64 / 1e6)
    } else {
        let s = a / 1_000_000;
        format!("{sign}{} min {} s", s / 60, s % 60)
    }
}

/// A size given on the command line: "80GiB", "40GB", "85899345920" (binary and decimal units).
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?}: expected a size such as 80GiB, 40GB or 85899345920"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "t" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => return Err(format!("{s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    Ok((n * scale) as u64)
}

/// `part` as a whole percentage of `whole`: "42%", "<1%" for a sliver, "–" of nothing.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "–".into();
    }
    let p = part as f64 * 100.0 / whole as f64;
    if p > 0.0 && p < 1.0 {
        "<1%".into()
    } else {
        format!("{p:.0}%")
    }
}

/// Decimal gigabytes, as model cards and planners quote them: 68719476736 → "68.7 GB".
pub fn gb(n: u64) -> String {
    let f = n as f64;
    if f >= 1e12 {
        format!("{:.2} TB", f / 1e12)
    } else if f >= 1e9 {
        format!("{:.1} GB", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.0} MB", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.0} kB", f / 1e3)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_bytes() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(1536 << 20), "1.50 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(signed_bytes(-2048), "-2.00 KiB");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(duration_us(999), "999 µs");
        assert_eq!(duration_us(12_300), "12.3 ms");
        assert_eq!(duration_us(200_000_000), "3 min 20 s");
    }
}
