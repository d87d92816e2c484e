//! A [`RuleSpec`] as JSON, behind the `serde` feature: the form the HTTP API takes
//! (`docs/openapi.json`'s `Rule`), which `stockade-wire` carries as it is. The guest
//! builds the grammar without this feature; it gets its rules through the WIT.
//!
//! The form is the API's, byte for byte: `methods` always written; `path_prefix`
//! absent when there is none (`null` is refused: absent is the only way to leave it
//! out); `headers` a map `{"Authorization": {"secret": "NAME"}}`, absent when empty,
//! read through an ordered map (a name given twice keeps its last value, and the
//! headers are in name order, as they always were); `intercept` absent when `true`.
//! Unknown fields are refused. The node protocol writes the same type in its own,
//! older form (`stockade-node-protocol`, `NodeRule`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::RuleSpec;

/// The API's JSON of one rule: [`RuleSpec`]'s fields with the encodings above.
#[derive(Serialize, Deserialize)]
#[serde(remote = "RuleSpec", deny_unknown_fields)]
struct Api {
    host: String,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    path_prefix: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "headers_out",
        deserialize_with = "headers_in"
    )]
    headers: Vec<(String, String)>,
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    intercept: bool,
}

impl Serialize for RuleSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Api::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for RuleSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RuleSpec, D::Error> {
        Api::deserialize(d)
    }
}

/// A header's value in the API: the name of a server-held secret.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretRef<S> {
    secret: S,
}

fn headers_out<S: Serializer>(headers: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(
        headers
            .iter()
            .map(|(name, secret)| (name, SecretRef { secret })),
    )
}

fn headers_in<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    let map = BTreeMap::<String, SecretRef<String>>::deserialize(d)?;
    Ok(map.into_iter().map(|(n, r)| (n, r.secret)).collect())
}

/// An optional field that, when present, has a value (`null` is refused).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<RuleSpec, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn the_api_form_reads_and_writes_as_it_always_did() {
        // (JSON in, the rule, JSON written back)
        let with_header = RuleSpec {
            headers: vec![
                ("Authorization".into(), "tok".into()),
                ("X-Key".into(), "k".into()),
            ],
            ..RuleSpec::new("api.example.com", &["GET"], Some("/v1/"))
        };
        let pinned = RuleSpec {
            intercept: false,
            ..RuleSpec::new("pinned.example", &[], None)
        };
        let rows: &[(&str, RuleSpec, &str)] = &[
            (
                r#"{"host":"h"}"#,
                RuleSpec::new("h", &[], None),
                r#"{"host":"h","methods":[]}"#,
            ),
            (
                r#"{"host":"h","intercept":true,"methods":[]}"#,
                RuleSpec::new("h", &[], None),
                r#"{"host":"h","methods":[]}"#,
            ),
            (
                r#"{"host":"pinned.example","intercept":false}"#,
                pinned,
                r#"{"host":"pinned.example","methods":[],"intercept":false}"#,
            ),
            (
                // Headers are read into name order; a name given twice keeps its last.
                r#"{"host":"api.example.com","methods":["GET"],"path_prefix":"/v1/","headers":{"X-Key":{"secret":"old"},"Authorization":{"secret":"tok"},"X-Key":{"secret":"k"}}}"#,
                with_header,
                r#"{"host":"api.example.com","methods":["GET"],"path_prefix":"/v1/","headers":{"Authorization":{"secret":"tok"},"X-Key":{"secret":"k"}}}"#,
            ),
        ];
        for (json, want, written) in rows {
            let got = parse(json).unwrap();
            assert_eq!(&got, want, "{json}");
            assert_eq!(serde_json::to_string(&got).unwrap(), *written, "{json}");
        }
    }

    #[test]
    fn null_and_unknown_fields_are_refused() {
        let bad = [
            r#"{"host":"h","path_prefix":null}"#,
            r#"{"host":"h","intercept":null}"#,
            r#"{"host":"h","headers":null}"#,
            r#"{"host":"h","extra":1}"#,
            r#"{"host":"h","headers":{"A":{"secret":"s","x":1}}}"#,
            r#"{"host":"h","headers":{"A":"s"}}"#,
            r#"{"methods":[]}"#,
        ];
        let read: Vec<&str> = bad.into_iter().filter(|b| parse(b).is_ok()).collect();
        assert!(read.is_empty(), "read, not refused: {read:?}");
    }
}
