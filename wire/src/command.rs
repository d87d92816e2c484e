//! A command as the API takes it (`POST …/exec`, `…/exec/stream`, `…/detached`), with
//! its grant. Unknown fields are refused, and so is `null` for an optional field (the
//! schema says absent is the only way to leave one out).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
pub use stockade_grammar::rules::RuleSpec;

/// A command as the API takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory (default `/workspace`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Run timeout in milliseconds. JSON Schema's `integer` admits `1000.0`: so does
    /// this field (found by Schemathesis), never `1000.5`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "whole_number"
    )]
    pub timeout_ms: Option<u64>,
    /// The fence's egress grant.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub grant: Option<GrantBody>,
    /// An approval token (floor commands).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub approval: Option<String>,
    /// Standard input as text (UTF-8), closed after it; absent: `/dev/null`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub stdin: Option<String>,
    /// Standard input as base64 (any bytes); at most one of `stdin` and `stdin_base64`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub stdin_base64: Option<String>,
}

/// A grant as the API takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantBody {
    /// Allow rules: the grammar's own type, in the API's JSON (its `serde` feature;
    /// checked by the one grammar, in the guest).
    pub rules: Vec<RuleSpec>,
    /// Hold what the rules refuse for want of a rule (`no-rule`, `method`, `path`) as a
    /// pending decision the approver answers (docs/EGRESS.md); absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ask: bool,
}

/// An optional field that, when present, has a value: `null` is refused, as the
/// schema says (absent is the only way to leave it out).
pub(crate) fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The largest whole number a lifetime's times take: 2^53 - 1, the largest a JSON
/// number holds exactly everywhere (JavaScript's `Number.MAX_SAFE_INTEGER`; in
/// milliseconds, 285 000 years), so the edge and this read the same numbers, and the
/// OpenAPI document's `maximum` is exact.
pub const MAX_WHOLE_MS: u64 = (1 << 53) - 1;

/// An optional non-negative integer up to [`MAX_WHOLE_MS`] that may be written as a
/// float with no fraction, or `null` (none), as a lifetime's times are.
pub(crate) fn whole_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    /// `null`, or a whole number as [`whole_number`] reads it.
    struct OrNull;
    impl<'de> serde::de::Visitor<'de> for OrNull {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a non-negative whole number or null")
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
            whole_number(d)
        }
    }
    match d.deserialize_option(OrNull)? {
        Some(v) if v > MAX_WHOLE_MS => Err(serde::de::Error::custom(format!(
            "{v} is more than {MAX_WHOLE_MS}"
        ))),
        v => Ok(v),
    }
}

/// An optional non-negative integer that may be written as a float with no fraction.
pub(crate) fn whole_number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Whole;
    impl serde::de::Visitor<'_> for Whole {
        type Value = u64;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a non-negative whole number")
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v)
                .map_err(|_| E::custom(format!("{v} is not a non-negative whole number")))
        }

        fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<u64, E> {
            if f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 {
                Ok(f as u64)
            } else {
                Err(E::custom(format!("{f} is not a non-negative whole number")))
            }
        }
    }
    d.deserialize_any(Whole).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_a_whole_number_written_either_way() {
        let rows: &[(&str, Option<u64>)] = &[
            (r#"{"argv":["x"],"timeout_ms":1000}"#, Some(1000)),
            (r#"{"argv":["x"],"timeout_ms":1000.0}"#, Some(1000)),
            (r#"{"argv":["x"]}"#, None),
        ];
        for (json, want) in rows {
            let c: CommandBody = serde_json::from_str(json).unwrap();
            assert_eq!(c.timeout_ms, *want, "{json}");
        }
        for bad in [
            r#"{"argv":["x"],"timeout_ms":1000.5}"#,
            r#"{"argv":["x"],"timeout_ms":-1}"#,
            r#"{"argv":["x"],"timeout_ms":"1000"}"#,
            r#"{"argv":["x"],"timeout_ms":null}"#,
        ] {
            assert!(serde_json::from_str::<CommandBody>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn null_and_unknown_fields_are_refused_absent_ones_are_left_out() {
        for bad in [
            r#"{"argv":["x"],"cwd":null}"#,
            r#"{"argv":["x"],"grant":null}"#,
            r#"{"argv":["x"],"nope":1}"#,
            r#"{"argv":["x"],"grant":{"rules":[{"host":"h","path_prefix":null}]}}"#,
            r#"{"argv":["x"],"grant":{"rules":[{"host":"h","extra":1}]}}"#,
        ] {
            assert!(serde_json::from_str::<CommandBody>(bad).is_err(), "{bad}");
        }
        let c = CommandBody {
            argv: vec!["true".into()],
            ..CommandBody::default()
        };
        assert_eq!(serde_json::to_string(&c).unwrap(), r#"{"argv":["true"]}"#);
        let r = RuleSpec::new("h", &[], None);
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"host":"h","methods":[]}"#
        );
    }
}
