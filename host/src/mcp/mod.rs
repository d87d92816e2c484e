//! The Model Context Protocol, so a coding agent uses a Stockade sandbox directly.
//! Two transports serve the same tools from one table: `stockade mcp` on stdio (a
//! client of a running server, like the CLI) and `/mcp` on the API listener
//! (Streamable HTTP, with the consumer's bearer token). Either way every tool is one
//! API call, and every check the server makes stays the server's (docs/MCP.md).
//!
//! * [`protocol`]: JSON-RPC, the lifecycle, the revisions; what a message means.
//! * [`tools`]: the tool table (schemas from `docs/openapi.json`) and their calls.
//! * [`stdio`]: newline-delimited JSON-RPC on stdin/stdout.
//! * [`http`]: Streamable HTTP (sessions, SSE progress, Origin and token checks).
//! * [`session`]: the HTTP sessions' bounded table (pure).

pub mod http;
pub mod protocol;
pub mod session;
mod stdio;
pub mod tools;

pub use protocol::{PROTOCOL_VERSIONS, negotiate};
pub(crate) use stdio::serve;
pub use tools::tools;
