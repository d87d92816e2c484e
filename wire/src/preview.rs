//! The preview routes' bodies (docs/PREVIEW.md): `POST /v1/sandboxes/{key}/previews`
//! takes an [`ExposeBody`] and answers a [`Preview`]; `GET …/previews` answers
//! [`Previews`]; `DELETE …/previews/{port}` answers [`Unexposed`].

use serde::{Deserialize, Serialize};

/// `POST …/previews`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExposeBody {
    /// The port inside the container (1-65535; the guest checks). A JSON integer may
    /// be written with a zero fraction (`8000.0`), as JSON Schema allows.
    #[serde(deserialize_with = "whole_u32")]
    pub port: u32,
}

fn whole_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = serde_json_number(d)?;
    if v >= 0.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX) {
        Ok(v as u32)
    } else {
        Err(serde::de::Error::custom(format!(
            "port: {v} is not a whole number in 0..=4294967295"
        )))
    }
}

/// Any JSON number, as an `f64` (exact for every `u32`).
fn serde_json_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    struct Num;
    impl serde::de::Visitor<'_> for Num {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<f64, E> {
            Ok(v)
        }
    }
    d.deserialize_any(Num)
}

/// One preview door.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preview {
    /// The port inside the container (on its `127.0.0.1`).
    pub port: u16,
    /// The door's random token (the substrate's, never the consumer's).
    pub token: String,
    /// Where the door answers (`http://{listen}/p/{token}/`, or the Host form).
    pub url: String,
}

/// `GET …/previews`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previews {
    /// The key's open doors, by port.
    pub previews: Vec<Preview>,
}

/// `DELETE …/previews/{port}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unexposed {
    /// The port whose door is closed (it may not have been open).
    pub unexposed: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_a_whole_number_written_either_way() {
        let rows: &[(&str, Option<u32>)] = &[
            (r#"{"port":8000}"#, Some(8000)),
            (r#"{"port":8000.0}"#, Some(8000)),
            (r#"{"port":0}"#, Some(0)),
            (r#"{"port":8000.5}"#, None),
            (r#"{"port":-1}"#, None),
            (r#"{"port":4294967296}"#, None),
            (r#"{"port":"8000"}"#, None),
            (r#"{"port":8000,"x":1}"#, None),
            (r#"{}"#, None),
        ];
        for (text, want) in rows {
            let got = serde_json::from_str::<ExposeBody>(text)
                .ok()
                .map(|b| b.port);
            assert_eq!(got, *want, "{text}");
        }
    }
}
