//! The API's answers as text for people (the CLI) and for models (`stockade mcp`): one
//! rendering per record, used by both, so a state, a denial or an egress row reads the
//! same wherever it is shown. Pure: wire types in, strings out.
//!
//! Every name or path a container chose goes through [`printable`]: a newline in an
//! artifact's name cannot forge a line, an escape sequence cannot repaint a terminal.

use stockade_wire::{
    Artifact, Denial, DetachedState, EgressEvent, ExecOutcome, ExitEvent, Limit, SecretInfo,
};

/// A name a container chose, safe to print on a terminal: control characters (a
/// newline that forges a line, an escape sequence) are shown escaped.
pub fn printable(name: &str) -> String {
    if name.chars().any(char::is_control) {
        name.escape_debug().to_string()
    } else {
        name.to_string()
    }
}

/// A detached state in the CLI's words: `running`, `exited(N)`, `gone(reason)`.
pub fn state_words(s: &DetachedState) -> String {
    match s {
        DetachedState::Running => "running".into(),
        DetachedState::Exited { code } => format!("exited({code})"),
        DetachedState::Gone { reason } => format!("gone({})", reason.as_str()),
    }
}

/// A byte count for people.
pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    }
}

/// What is said after an exec's output: a timeout, truncation, limits reached.
pub fn outcome_notes(out: &ExitEvent) -> Vec<&'static str> {
    let mut notes = vec![];
    if out.timed_out {
        notes.push("the command timed out and was killed");
    }
    if out.truncated {
        notes.push("output was truncated at the configured bound");
    }
    for limit in &out.limits {
        notes.push(match limit {
            Limit::Pids => "a fork failed: the container's process limit was reached",
            Limit::Memory => {
                "the OOM killer killed a process: the container's memory limit was reached"
            }
            Limit::Disk => "the container's storage (/workspace, /artifacts, /tmp) is full",
        });
    }
    notes
}

/// An exec's outcome as one text: the exit code, the output, what the notes say and
/// how many requests the fence refused (what `stockade mcp` tells a model).
pub fn exec_text(out: &ExecOutcome) -> String {
    let mut text = format!("exit code {}", out.exit_code);
    if out.timed_out {
        text.push_str(" (timed out: killed)");
    }
    for (label, s) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        if !s.is_empty() {
            text.push_str(&format!("\n--- {label} ---\n{s}"));
        }
    }
    let exit = ExitEvent::from(out);
    for note in outcome_notes(&exit)
        .into_iter()
        .skip(usize::from(out.timed_out))
    {
        text.push_str(&format!("\n({note})"));
    }
    if out.denials > 0 {
        text.push_str(&format!(
            "\n({} network requests were denied: see the denials tool)",
            out.denials
        ));
    }
    text
}

/// One refused request: time (UTC), method, host and path, the reason, the fence.
/// The port is not shown: a denial does not carry it (the WIT `denial` record, the
/// store's `denials` rows and the wire's [`Denial`] have none; an admitted row does).
pub fn denial_line(d: &Denial) -> String {
    format!("{}  {}", utc(d.at_ms), denial_tail(d))
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time to the millisecond,
/// e.g. `2026-12-06T19:26:43.123Z`.
pub fn utc(at_ms: u64) -> String {
    let (secs, ms) = (at_ms / 1000, at_ms % 1000);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch): (year, month 1-12, day 1-31).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shifted to 0000-03-01, so a leap day ends its year; eras of 400 years.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097; // day of the era, [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the year from March 1
    let mp = (5 * doy + 2) / 153; // month from March, [0, 11]
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// An admitted request's host with its port (`host:port`, `[v6]:port`); a row without
/// one (port 0: a summary row) shows the host alone.
fn host_port(host: &str, port: u16) -> String {
    match port {
        0 => printable(host),
        p if host.contains(':') => format!("[{}]:{p}", printable(host)),
        p => format!("{}:{p}", printable(host)),
    }
}

/// One artifact: its size, right-aligned, and its name.
pub fn artifact_line(a: &Artifact) -> String {
    format!("{:>10}  {}", a.size, printable(&a.name))
}

/// A known key: `KEY  running|stopped  ends TIME (abort|checkpoint)|no end  [network
/// HOST,… [(ask)]]  NAME=VALUE…`.
pub fn sandbox_line(s: &stockade_wire::SandboxInfo) -> String {
    let mut line = format!(
        "{}  {}  {}",
        printable(&s.key),
        if s.running { "running" } else { "stopped" },
        match &s.lifetime {
            Some(l) => format!(
                "ends {} ({})",
                utc(l.ends_at_ms),
                match l.on_end {
                    stockade_wire::OnEnd::Abort => "abort",
                    stockade_wire::OnEnd::Checkpoint => "checkpoint",
                }
            ),
            None => "no end".into(),
        }
    );
    if let Some(g) = &s.network {
        let hosts: Vec<&str> = g.rules.iter().map(|r| r.host.as_str()).collect();
        line.push_str(&format!(
            "  network {}{}",
            if hosts.is_empty() {
                "(no rule)".to_string()
            } else {
                printable(&hosts.join(","))
            },
            if g.ask { " (ask)" } else { "" }
        ));
    }
    for (n, v) in &s.metadata {
        line.push_str(&format!("  {}={}", printable(n), printable(v)));
    }
    line
}

/// `snapshot list`: `NAME  TAKEN`.
pub fn snapshot_line(s: &stockade_wire::Snapshot) -> String {
    format!("{}  {}", printable(&s.name), utc(s.at_ms))
}

/// `token list`: ID  KEYS  share N  NAME  [revoked TIME].
pub fn token_line(t: &stockade_wire::TokenInfo) -> String {
    let mut line = format!(
        "{}  {}  share {}  {}",
        printable(&t.id),
        printable(&t.keys),
        t.ceiling,
        printable(&t.name)
    );
    if let Some(at) = t.revoked_ms {
        line.push_str(&format!("  revoked {}", utc(at)));
    }
    line
}

/// One secret: its name, where it comes from, where it may go.
pub fn secret_line(s: &SecretInfo) -> String {
    format!(
        "{}  ({})  {}",
        printable(&s.name),
        printable(&s.source),
        s.binding
            .as_deref()
            .map(printable)
            .as_deref()
            .unwrap_or("unbound")
    )
}

/// One row of the egress timeline: time, decision, method, host and path, then the
/// status and bytes of an admitted request or the reason of a denial.
pub fn egress_line(e: &EgressEvent) -> String {
    let d = match e {
        EgressEvent::Deny(d) => {
            return format!("{}  deny  {}", utc(d.at_ms), denial_tail(d));
        }
        EgressEvent::Allow(a) => a,
    };
    if d.via == "summary" {
        // A fence's summary row: how many admitted requests its rate bound left out of
        // the audit (they were admitted; only their records are missing).
        return format!(
            "{}  allow {} more admitted requests of fence {} not recorded ({})",
            utc(d.at_ms),
            d.suppressed,
            printable(&d.fence),
            printable(&d.error)
        );
    }
    let creds = if d.credentials.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = d.credentials.iter().map(|n| printable(n)).collect();
        format!("  +{}", names.join(",+"))
    };
    let error = if d.error.is_empty() {
        String::new()
    } else {
        format!("  ({})", printable(&d.error))
    };
    format!(
        "{}  allow {} {}{}  {} {}  {}B up {}B down{creds}{error}",
        utc(d.at_ms),
        printable(&d.method),
        host_port(&d.host, d.port),
        printable(&d.path),
        printable(&d.via),
        d.status,
        d.bytes_up,
        d.bytes_down
    )
}

/// A denial after its decision: method, host and path, the reason, the fence.
fn denial_tail(d: &Denial) -> String {
    format!(
        "{} {}{}  {}  ({})",
        printable(&d.method),
        printable(&d.host),
        printable(&d.path),
        printable(&d.reason),
        printable(&d.rule_set)
    )
}

/// Records as lines, one each; `empty` when there are none.
pub fn lines<T>(items: &[T], line: impl Fn(&T) -> String, empty: &str) -> String {
    if items.is_empty() {
        return empty.to_string();
    }
    items.iter().map(line).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use stockade_wire::{Admitted, GoneReason};

    #[test]
    fn states_read_in_the_clis_words() {
        let gone = |reason| DetachedState::Gone { reason };
        let rows = [
            (DetachedState::Running, "running"),
            (DetachedState::Exited { code: 42 }, "exited(42)"),
            (DetachedState::Exited { code: -9 }, "exited(-9)"),
            (gone(GoneReason::Unknown), "gone(unknown)"),
            (gone(GoneReason::NotTracked), "gone(not-tracked)"),
            (
                gone(GoneReason::ContainerUnreachable),
                "gone(container-unreachable)",
            ),
        ];
        for (state, words) in rows {
            assert_eq!(state_words(&state), words);
        }
    }

    #[test]
    fn a_fence_summary_row_prints_what_the_audit_left_out() {
        let row = EgressEvent::Allow(Admitted {
            at_ms: 7,
            fence: "f-1".into(),
            via: "summary".into(),
            suppressed: 42,
            error: "rate-limited".into(),
            ..Admitted::default()
        });
        assert_eq!(
            egress_line(&row),
            "1970-01-01T00:00:00.007Z  allow 42 more admitted requests of fence f-1 not recorded (rate-limited)"
        );
    }

    #[test]
    fn egress_rows_read_as_the_timeline() {
        let allow = EgressEvent::Allow(Admitted {
            at_ms: 5,
            method: "GET".into(),
            host: "127.0.0.2".into(),
            port: 8443,
            path: "/api/x".into(),
            via: "https".into(),
            status: 200,
            bytes_up: 0,
            bytes_down: 12,
            credentials: vec!["authorization".into()],
            ..Admitted::default()
        });
        assert_eq!(
            egress_line(&allow),
            "1970-01-01T00:00:00.005Z  allow GET 127.0.0.2:8443/api/x  https 200  0B up 12B down  +authorization"
        );
        let deny = EgressEvent::Deny(Denial {
            at_ms: 6,
            host: "127.0.0.2".into(),
            method: "GET".into(),
            path: "/elsewhere".into(),
            rule_set: "f".into(),
            reason: "path".into(),
        });
        assert_eq!(
            egress_line(&deny),
            "1970-01-01T00:00:00.006Z  deny  GET 127.0.0.2/elsewhere  path  (f)"
        );
        let EgressEvent::Deny(d) = deny else {
            unreachable!()
        };
        assert_eq!(
            denial_line(&Denial {
                at_ms: 1_796_585_203_123,
                ..d
            }),
            "2026-12-06T19:26:43.123Z  GET 127.0.0.2/elsewhere  path  (f)"
        );
    }

    #[test]
    fn epoch_milliseconds_read_as_rfc3339_utc() {
        // (ms since the epoch, the time): the epoch, the last day of a year, leap days
        // (2000 is a leap year, 2100 is not), month ends, a far year.
        let rows = [
            (0, "1970-01-01T00:00:00.000Z"),
            (999, "1970-01-01T00:00:00.999Z"),
            (86_399_999, "1970-01-01T23:59:59.999Z"),
            (86_400_000, "1970-01-02T00:00:00.000Z"),
            (31_535_999_000, "1970-12-31T23:59:59.000Z"),
            (31_536_000_000, "1971-01-01T00:00:00.000Z"),
            (68_169_600_000, "1972-02-29T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (951_868_800_000, "2000-03-01T00:00:00.000Z"),
            (1_709_251_199_000, "2024-02-29T23:59:59.000Z"),
            (1_796_585_203_123, "2026-12-06T19:26:43.123Z"),
            (4_107_456_000_000, "2100-02-28T00:00:00.000Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        ];
        for (ms, want) in rows {
            assert_eq!(utc(ms), want, "{ms}");
        }
    }

    #[test]
    fn an_admitted_host_shows_its_port() {
        let rows = [
            ("pypi.org", 443, "pypi.org:443"),
            ("127.0.0.2", 8080, "127.0.0.2:8080"),
            ("::1", 443, "[::1]:443"),
            ("pypi.org", 0, "pypi.org"),
        ];
        for (host, port, want) in rows {
            assert_eq!(host_port(host, port), want);
        }
    }

    #[test]
    fn names_a_container_chose_cannot_forge_terminal_lines() {
        assert_eq!(printable("report.txt"), "report.txt");
        assert_eq!(printable("a\n999 fake"), "a\\n999 fake");
        assert!(!printable("x\u{1b}[31mred").contains('\u{1b}'));
        let a = Artifact {
            name: "a\n999 fake".into(),
            size: 1,
        };
        assert_eq!(artifact_line(&a).lines().count(), 1);
    }

    #[test]
    fn an_exec_text_says_the_exit_output_limits_and_denials() {
        let out = ExecOutcome {
            exit_code: -1,
            stdout: "hi\n".into(),
            timed_out: true,
            denials: 2,
            limits: vec![Limit::Memory],
            ..ExecOutcome::default()
        };
        assert_eq!(
            exec_text(&out),
            "exit code -1 (timed out: killed)\n--- stdout ---\nhi\n\
             \n(the OOM killer killed a process: the container's memory limit was reached)\
             \n(2 network requests were denied: see the denials tool)"
        );
    }
}
