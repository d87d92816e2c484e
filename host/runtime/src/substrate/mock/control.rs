//! Direct control of the mock (`POST /v1/mock/control`, docs/MOCK.md "Direct
//! control"): what happens to a sandbox from outside the guest's calls, the conformance
//! scenarios' `mock` steps (docs/CONFORMANCE.md) for a consumer. Pure: parsing only;
//! [`super::Mock::control`] carries it out. No trace entry, no guest call.

use serde::Deserialize;

/// Which sandbox: its key (a consumer's name for it) or the mock's container id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    /// The key's live container.
    Key(String),
    /// This container.
    Container(String),
}

/// One control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// The container stops on its own (gone with its processes; the host hears of it
    /// as of any container that died).
    StopContainer(Which),
    /// A tracked process exits with this code.
    ExitProcess(Which, String, i32),
    /// The container forgets a tracked process.
    LoseProcess(Which, String),
    /// A file under the key's `/artifacts`.
    PutArtifact {
        /// The key.
        key: String,
        /// Its name.
        name: String,
        /// Its bytes.
        bytes: Vec<u8>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    mock: String,
    key: Option<String>,
    container: Option<String>,
    id: Option<String>,
    code: Option<i32>,
    name: Option<String>,
    bytes: Option<String>,
}

/// Parse a control request; the error says what is wrong.
pub fn parse(v: &serde_json::Value) -> Result<Control, String> {
    if !v.is_object() {
        return Err("a control is a JSON object: {\"mock\": …}".into());
    }
    let d: Doc = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let which = || match (&d.key, &d.container) {
        (Some(k), None) if !k.is_empty() => Ok(Which::Key(k.clone())),
        (None, Some(c)) if !c.is_empty() => Ok(Which::Container(c.clone())),
        _ => Err("exactly one of key and container".to_string()),
    };
    let id = || d.id.clone().ok_or_else(|| "id: missing".to_string());
    match d.mock.as_str() {
        "stop-container" => Ok(Control::StopContainer(which()?)),
        "exit-process" => Ok(Control::ExitProcess(
            which()?,
            id()?,
            d.code.ok_or("code: missing")?,
        )),
        "lose-process" => Ok(Control::LoseProcess(which()?, id()?)),
        "put-artifact" => {
            let key = d
                .key
                .clone()
                .filter(|k| !k.is_empty())
                .ok_or("key: missing")?;
            let name = d.name.clone().unwrap_or_default();
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(format!("name {name:?}: one file name"));
            }
            Ok(Control::PutArtifact {
                key,
                name,
                bytes: d.bytes.clone().unwrap_or_default().into_bytes(),
            })
        }
        other => Err(format!(
            "mock {other:?}: stop-container, exit-process, lose-process or put-artifact"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_control_reads_as_the_scenarios_mock_steps_do() {
        let rows = [
            (
                json!({"mock": "stop-container", "key": "k"}),
                Control::StopContainer(Which::Key("k".into())),
            ),
            (
                json!({"mock": "exit-process", "container": "mock-c1", "id": "p", "code": 3}),
                Control::ExitProcess(Which::Container("mock-c1".into()), "p".into(), 3),
            ),
            (
                json!({"mock": "lose-process", "key": "k", "id": "p"}),
                Control::LoseProcess(Which::Key("k".into()), "p".into()),
            ),
            (
                json!({"mock": "put-artifact", "key": "k", "name": "r.txt", "bytes": "hi"}),
                Control::PutArtifact {
                    key: "k".into(),
                    name: "r.txt".into(),
                    bytes: b"hi".to_vec(),
                },
            ),
        ];
        for (doc, want) in rows {
            assert_eq!(parse(&doc), Ok(want), "{doc}");
        }
    }

    #[test]
    fn a_bad_control_is_refused_saying_why() {
        let rows = [
            (json!({"mock": "reboot", "key": "k"}), "mock \"reboot\""),
            (
                json!({"mock": "stop-container"}),
                "exactly one of key and container",
            ),
            (
                json!({"mock": "stop-container", "key": "k", "container": "c"}),
                "exactly one",
            ),
            (
                json!({"mock": "exit-process", "key": "k", "id": "p"}),
                "code: missing",
            ),
            (json!({"mock": "lose-process", "key": "k"}), "id: missing"),
            (
                json!({"mock": "put-artifact", "key": "k", "name": "../x"}),
                "one file name",
            ),
            (json!({"mock": "put-artifact", "name": "x"}), "key: missing"),
            (
                json!({"mock": "stop-container", "key": "k", "when": 1}),
                "unknown field",
            ),
            (json!("stop"), "a control is a JSON object"),
        ];
        for (doc, want) in rows {
            let e = parse(&doc).expect_err(&doc.to_string());
            assert!(e.contains(want), "{doc}: {e:?} does not say {want:?}");
        }
    }
}
