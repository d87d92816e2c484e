//! `stockade mcp`: the protocol on stdin/stdout, newline-delimited JSON-RPC 2.0 (logs
//! go to stderr), as a client of a running `stockade serve` with the CLI's server and
//! token.

use stockade_client::Client;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{protocol, tools};

/// Serve MCP on stdin/stdout until stdin closes.
pub(crate) async fn serve(client: Client) -> std::io::Result<()> {
    let tools = tools::tools();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(resp) = protocol::handle(&client, &tools, &line).await {
            let mut bytes = serde_json::to_vec(&resp).unwrap_or_default();
            bytes.push(b'\n');
            out.write_all(&bytes).await?;
            out.flush().await?;
        }
    }
    Ok(())
}
