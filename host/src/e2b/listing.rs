//! `GET /v2/sandboxes`'s query (pure, table-tested): the SDK's `Sandbox.list(query=…,
//! limit=…)` and its paginator. A caller's sandboxes (the handler has already kept
//! only the token's own) filtered by `metadata` (every pair must match), `state`
//! (`running`, `paused`), `startedAfter` (RFC 3339, inclusive) and `template`,
//! ordered by start (`order`: `asc`, the default, or `desc`; ties by id), one page of
//! `limit` (1 to 100, default 100) after `nextToken`. The next page's token is answered
//! in the `x-next-token` header, as E2B does, only when more remain.
//!
//! A parameter that is not one of these, or a value that does not parse, is refused
//! (400): a filter that is silently ignored would list more than was asked.

/// The most a page holds (E2B's bound) and the default.
pub const MAX_LIMIT: usize = 100;

/// A listed sandbox as the query sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row<'a> {
    pub id: &'a str,
    pub started_ms: u64,
    pub paused: bool,
    pub template: &'a str,
    pub metadata: &'a serde_json::Map<String, serde_json::Value>,
}

/// The query, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    metadata: Vec<(String, String)>,
    /// `Some([running?, paused?])`: the states kept; none: both.
    states: Option<(bool, bool)>,
    started_after_ms: Option<u64>,
    template: Option<String>,
    desc: bool,
    limit: usize,
    after: Option<(u64, String)>,
}

impl Query {
    /// Parse a raw query string (what follows `?`, if anything).
    pub fn parse(raw: Option<&str>) -> Result<Self, String> {
        let mut q = Query {
            metadata: Vec::new(),
            states: None,
            started_after_ms: None,
            template: None,
            desc: false,
            limit: MAX_LIMIT,
            after: None,
        };
        for (k, v) in form_pairs(raw.unwrap_or(""))? {
            match k.as_str() {
                // The SDK sends the pairs form-encoded, each key and value quoted
                // first (`urlencode({quote(k): quote(v)})`), as this one parameter's
                // value: decoded once more each.
                "metadata" => {
                    for (k, v) in form_pairs(&v)? {
                        q.metadata.push((decode(&k)?, decode(&v)?));
                    }
                }
                "state" => {
                    let (mut running, mut paused) = (false, false);
                    for s in v.split(',') {
                        match s {
                            "running" => running = true,
                            "paused" => paused = true,
                            other => {
                                return Err(format!("state: {other:?} is not running or paused"));
                            }
                        }
                    }
                    q.states = Some((running, paused));
                }
                "startedAfter" => q.started_after_ms = Some(rfc3339_ms(&v)?),
                "template" => q.template = Some(v),
                "order" => {
                    q.desc = match v.as_str() {
                        "asc" => false,
                        "desc" => true,
                        other => return Err(format!("order: {other:?} is not asc or desc")),
                    }
                }
                "limit" => {
                    q.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| format!("limit: {v:?} is not a number from 1 to 100"))?;
                }
                "nextToken" => q.after = Some(cursor(&v)?),
                other => return Err(format!("{other:?} is not a parameter of this list")),
            }
        }
        Ok(q)
    }

    /// One page of `rows` (the caller's own) and the next page's token, if more remain.
    pub fn page<'a>(&self, mut rows: Vec<Row<'a>>) -> (Vec<Row<'a>>, Option<String>) {
        rows.retain(|r| self.keeps(r));
        rows.sort_by(|a, b| (a.started_ms, a.id).cmp(&(b.started_ms, b.id)));
        if self.desc {
            rows.reverse();
        }
        if let Some((ms, id)) = &self.after {
            let at = (*ms, id.as_str());
            rows.retain(|r| {
                let here = (r.started_ms, r.id);
                if self.desc { here < at } else { here > at }
            });
        }
        let more = rows.len() > self.limit;
        rows.truncate(self.limit);
        let next = more
            .then(|| rows.last().map(|r| token(r.started_ms, r.id)))
            .flatten();
        (rows, next)
    }

    fn keeps(&self, r: &Row<'_>) -> bool {
        let state = match self.states {
            None => true,
            Some((running, paused)) => (r.paused && paused) || (!r.paused && running),
        };
        state
            && self.started_after_ms.is_none_or(|t| r.started_ms >= t)
            && self.template.as_deref().is_none_or(|t| t == r.template)
            && self
                .metadata
                .iter()
                .all(|(k, v)| r.metadata.get(k).and_then(|m| m.as_str()) == Some(v.as_str()))
    }
}

/// The next page's token: the last row's start and id, hex (opaque to the caller).
fn token(started_ms: u64, id: &str) -> String {
    format!("{started_ms}:{id}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A token back to (start, id); anything else is refused.
fn cursor(t: &str) -> Result<(u64, String), String> {
    let bad = || format!("nextToken: {t:?} is not a token this server answered");
    if !t.len().is_multiple_of(2) || t.len() > 256 {
        return Err(bad());
    }
    let bytes = (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(t.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| bad())?;
    let s = String::from_utf8(bytes).map_err(|_| bad())?;
    let (ms, id) = s.split_once(':').ok_or_else(bad)?;
    Ok((ms.parse().map_err(|_| bad())?, id.to_string()))
}

/// `application/x-www-form-urlencoded` pairs (`+` a space, `%XX` a byte; the whole
/// UTF-8). An empty string is no pairs; a pair without `=` has an empty value.
pub fn form_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("{s:?}: a % escape that is not two hex digits"))?;
                out.push(hex);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

/// RFC 3339 (`2026-12-07T05:52:31Z`, `…31.5+01:00`) to ms since the epoch; before
/// 1970 or malformed: refused.
pub fn rfc3339_ms(s: &str) -> Result<u64, String> {
    let bad = || format!("startedAfter: {s:?} is not an RFC 3339 time");
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        s.get(r)
            .filter(|d| d.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|d| d.parse().ok())
            .ok_or_else(bad)
    };
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return Err(bad());
    }
    let mut i = 19;
    let mut frac_ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let digits = &s[start..i.min(start + 3)];
        frac_ms = digits.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_s = match s.get(i..) {
        Some("Z" | "z") => 0,
        Some(o) if o.len() == 6 && matches!(&o[..1], "+" | "-") && &o[3..4] == ":" => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            let v = oh * 3600 + om * 60;
            if o.starts_with('-') { -v } else { v }
        }
        _ => return Err(bad()),
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    u64::try_from(secs * 1000 + frac_ms).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn queries_parse_or_are_refused() {
        let ok = |raw: &str| Query::parse(Some(raw)).unwrap_or_else(|e| panic!("{raw}: {e}"));
        assert_eq!(ok("").limit, 100);
        assert_eq!(ok("limit=1").limit, 1);
        assert!(ok("order=desc").desc);
        assert_eq!(ok("state=paused").states, Some((false, true)));
        assert_eq!(ok("state=running%2Cpaused").states, Some((true, true)));
        // The SDK's metadata: `urlencode({quote(k): quote(v)})` as one value, that
        // value encoded again as a parameter: "ann b" is ann%252520b.
        assert_eq!(
            ok("metadata=user%3Dann%252520b%26team%3Dx").metadata,
            [
                ("user".to_string(), "ann b".to_string()),
                ("team".to_string(), "x".to_string())
            ]
        );
        assert_eq!(
            ok("startedAfter=1970-01-01T00%3A00%3A01.5%2B00%3A00").started_after_ms,
            Some(1500)
        );
        for raw in [
            "limit=0",
            "limit=101",
            "limit=x",
            "order=up",
            "state=stopped",
            "state=",
            "startedAfter=yesterday",
            "nextToken=zz",
            "nextToken=41",
            "metadata=%ZZ",
            "colour=red",
        ] {
            assert!(Query::parse(Some(raw)).is_err(), "{raw} was accepted");
        }
    }

    #[test]
    fn rfc3339_times() {
        for (s, ms) in [
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2026-12-07T05:52:31Z", Some(1_796_622_751_000)),
            ("2026-12-07T06:52:31.250+01:00", Some(1_796_622_751_250)),
            ("2026-12-07T05:52:31.123456-00:00", Some(1_796_622_751_123)),
            ("1969-12-31T23:59:59Z", None),
            ("2026-13-07T05:52:31Z", None),
            ("2026-12-07T05:52:31", None),
            ("2026-12-07T05:52:31.Z", None),
            ("2026-12-07T05:52:31+0100", None),
        ] {
            assert_eq!(rfc3339_ms(s).ok(), ms, "{s}");
        }
        // The control plane's own format reads back.
        let t = 1_796_622_751_000;
        assert_eq!(rfc3339_ms(&super::super::control::rfc3339(t)), Ok(t));
    }

    #[test]
    fn pages_filter_order_and_continue() {
        let (m1, m2, none) = (
            meta(json!({"user": "ann", "team": "x"})),
            meta(json!({"user": "bob"})),
            meta(json!({})),
        );
        let rows = || {
            vec![
                Row {
                    id: "c",
                    started_ms: 30,
                    paused: false,
                    template: "base",
                    metadata: &m1,
                },
                Row {
                    id: "a",
                    started_ms: 10,
                    paused: true,
                    template: "base",
                    metadata: &m2,
                },
                Row {
                    id: "b",
                    started_ms: 20,
                    paused: false,
                    template: "other",
                    metadata: &none,
                },
                Row {
                    id: "d",
                    started_ms: 30,
                    paused: false,
                    template: "base",
                    metadata: &none,
                },
            ]
        };
        let ids = |raw: &str| {
            let (page, next) = Query::parse(Some(raw)).unwrap().page(rows());
            (page.iter().map(|r| r.id).collect::<Vec<_>>(), next)
        };
        assert_eq!(ids("").0, ["a", "b", "c", "d"]);
        assert_eq!(ids("order=desc").0, ["d", "c", "b", "a"]);
        assert_eq!(ids("state=paused").0, ["a"]);
        assert_eq!(ids("state=running").0, ["b", "c", "d"]);
        assert_eq!(ids("metadata=user%3Dann").0, ["c"]);
        assert_eq!(ids("metadata=user%3Dann%26team%3Dx").0, ["c"]);
        assert_eq!(ids("metadata=user%3Dann%26team%3Dy").0, Vec::<&str>::new());
        assert_eq!(ids("template=other").0, ["b"]);
        assert_eq!(
            ids("startedAfter=1970-01-01T00%3A00%3A00.020Z").0,
            ["b", "c", "d"]
        );
        // Pages of two, in both orders: every row once, the last page with no token.
        for (order, want) in [
            ("asc", ["a", "b", "c", "d"]),
            ("desc", ["d", "c", "b", "a"]),
        ] {
            let (first, next) = ids(&format!("limit=2&order={order}"));
            assert_eq!(first, want[..2]);
            let next = next.expect("a token: more remain");
            let (second, last) = ids(&format!("limit=2&order={order}&nextToken={next}"));
            assert_eq!(second, want[2..]);
            assert_eq!(last, None);
        }
        assert_eq!(ids("limit=4").1, None);
    }
}
