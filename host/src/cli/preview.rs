//! `stockade expose KEY PORT`, `unexpose KEY PORT`, `previews KEY` (docs/DESIGN.md §8):
//! the preview routes, one call each. `expose` prints the door's URL (`--json`: the
//! whole door); `previews` one `PORT  URL` line per door.

use stockade_client::Client;

use super::Failure;
use super::commands::print_or;

/// `expose`: the door's URL.
pub(super) async fn expose(c: &Client, key: &str, port: u32, json: bool) -> Result<i32, Failure> {
    let p = c.expose(key, port).await?;
    print_or(json, &p, |p| p.url.clone());
    Ok(0)
}

/// `unexpose`.
pub(super) async fn unexpose(c: &Client, key: &str, port: u32, json: bool) -> Result<i32, Failure> {
    let out = c.unexpose(key, port).await?;
    print_or(json, &out, |_| format!("unexposed {key} port {port}"));
    Ok(0)
}

/// `previews`: one line per door.
pub(super) async fn previews(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let previews = c.previews(key).await?;
    let out = stockade_wire::Previews { previews };
    print_or(json, &out, |o| {
        o.previews
            .iter()
            .map(|p| format!("{:>5}  {}", p.port, p.url))
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(0)
}
