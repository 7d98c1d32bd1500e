//! How a gateway answer becomes an MCP tool result: the plain sentence first, then the record
//! as JSON, and the same record as structured content. Shared by the MCP tools, the durable
//! tasks and the stored SSE streams, so every path renders one execution the same way.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value};

use crate::front::gateway::GatewayError;

/// A gateway error as a tool result marked as an error, with its JSON-RPC code.
pub fn tool_error(e: GatewayError) -> CallToolResult {
    CallToolResult::structured_error(json!({"error": e.message, "code": e.code}))
}

/// A result: the plain sentence first, then the record as JSON; structured content too.
pub fn result(v: Value) -> CallToolResult {
    let summary = v
        .get("summary")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut r = CallToolResult::structured(v.clone());
    let mut content = Vec::new();
    if !summary.is_empty() {
        content.push(ContentBlock::text(summary));
    }
    content.push(ContentBlock::text(v.to_string()));
    r.content = content;
    r
}
