//! One MCP tool per named operation: its input schema from the arguments, its description
//! ending in the replay contract in plain words, the same contract as data in the tool's
//! `_meta["cairn/contract"]`, and MCP's hints (read-only, idempotent, destructive) from the
//! class.
//!
//! [`add_tools`] works on the server's tool router, whatever transport serves it.

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResponse, MetaObject, Tool, ToolAnnotations};
use rmcp::ErrorData;

use super::CairnMcp;
use crate::intent::OpClass;
use crate::operations::doc;
use crate::operations::OperationsFile;

/// The `_meta` key that holds an operation's contract.
pub const META_KEY: &str = "cairn/contract";

/// The MCP tool of one operation.
pub fn tool(op: &crate::operations::Operation) -> Tool {
    let schema = doc::input_schema(op)
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut meta = MetaObject::new();
    meta.0.insert(META_KEY.into(), doc::contract_json(op));
    let class = op.class();
    let annotations = ToolAnnotations::new()
        .read_only(class == OpClass::ReadOnly)
        .idempotent(matches!(class, OpClass::ReadOnly | OpClass::Idempotent))
        .destructive(class == OpClass::Irreversible)
        // Every operation reaches hosts outside the server.
        .open_world(true);
    Tool::new(op.name.clone(), doc::tool_description(op), Arc::new(schema))
        .with_meta(meta)
        .with_annotations(annotations)
        .with_raw_output_schema(super::schema::operation())
}

/// Add a tool for every operation of `file` to `router`. An operation named like a built-in
/// tool replaces it (the checks keep names to tool-name characters).
pub fn add_tools(router: &mut ToolRouter<CairnMcp>, file: &OperationsFile) {
    for op in file.operations.values() {
        router.add_route(ToolRoute::new_dyn(tool(op), call));
    }
}

fn call(ctx: ToolCallContext<'_, CairnMcp>) -> BoxFuture<'_, Result<CallToolResponse, ErrorData>> {
    Box::pin(async move {
        let name = ctx.name.to_string();
        let args = ctx.arguments.unwrap_or_default();
        ctx.service
            .call_operation(ctx.request_context, name, args)
            .await
    })
}
