//! What MCP clients in the wild send to `/mcp`, read by one rule: **the body is the request;
//! routing headers are hints about it.** A header the body implies but the client left out is
//! filled in from the body; a header that disagrees with the body is refused with the
//! protocol's own error (JSON-RPC `-32020`, HTTP 400), since a proxy in front may already have
//! routed on it. rmcp's Streamable HTTP service then sees a request whose headers and body
//! agree. The choices, header by header, are listed in `docs/GATEWAYS.md`.
//!
//! It also answers, as JSON-RPC errors a client can read, the two failures rmcp answers in
//! plain text: a body over the size limit (413) and a body that is not JSON (400, `-32700`).
//! Nothing here touches the journal: a refused request leaves nothing behind.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::{Front, HttpError};

/// The protocol's "header mismatch" error code (2026-07-28, Streamable HTTP).
pub const HEADER_MISMATCH: i64 = -32020;
/// The routing headers: (name as `HeaderName` wants it, as the protocol spells it).
const VERSION: (&str, &str) = ("mcp-protocol-version", "MCP-Protocol-Version");
/// The `_meta` key of a 2026-07-28 request that carries its protocol version.
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const METHOD: (&str, &str) = ("mcp-method", "Mcp-Method");
const NAME: (&str, &str) = ("mcp-name", "Mcp-Name");
const B64_PREFIX: &str = "=?base64?";
const B64_SUFFIX: &str = "?=";

/// The body field a method's `Mcp-Name` mirrors (the protocol's table: tools and prompts by
/// name, resources by URI, tasks by task ID).
pub fn name_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    }
}

/// A header value as the protocol encodes it: as is when it is visible ASCII with no
/// leading or trailing blank, else `=?base64?…?=` of its UTF-8 bytes.
pub fn encode(value: &str) -> String {
    let visible = value.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let blank_edge = value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']);
    let looks_wrapped = value.starts_with(B64_PREFIX) && value.ends_with(B64_SUFFIX);
    let plain = visible && !blank_edge && !looks_wrapped;
    if plain {
        value.to_owned()
    } else {
        let b64 = base64::engine::general_purpose::STANDARD.encode(value.as_bytes());
        format!("{B64_PREFIX}{b64}{B64_SUFFIX}")
    }
}

/// A header value decoded (`None`: a `=?base64?…?=` value that is not Base64 of UTF-8).
pub fn decode(raw: &str) -> Option<String> {
    match raw
        .strip_prefix(B64_PREFIX)
        .and_then(|r| r.strip_suffix(B64_SUFFIX))
    {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
        None => Some(raw.to_owned()),
    }
}

/// Why a request's headers cannot stand with its body (the `-32020` message), after filling
/// in what the body implies and the client left out.
pub fn reconcile(headers: &mut HeaderMap, msg: &Value) -> Result<(), HttpError> {
    let Some(method) = msg.get("method").and_then(Value::as_str) else {
        // A response or an error from the client: no routing headers apply.
        return Ok(());
    };
    let params = msg.get("params");
    if let Some(v) = params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_VERSION))
        .and_then(Value::as_str)
    {
        hint(headers, VERSION, v, "the request's _meta protocolVersion")?;
    }
    hint(headers, METHOD, method, "the body's method")?;
    if let Some(v) = name_field(method)
        .and_then(|field| params?.get(field))
        .and_then(Value::as_str)
    {
        hint(headers, NAME, v, &format!("the body's value {v:?}"))?;
    }
    Ok(())
}

/// A `tasks/*` request names its task by a string `taskId`; anything else is invalid params
/// (rmcp would answer "method not found" for a body it cannot read as the method's).
fn task_id_is_a_string(msg: &Value) -> Result<(), HttpError> {
    let method = msg
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name_field(method) != Some("taskId") {
        return Ok(());
    }
    match msg.get("params").and_then(|p| p.get("taskId")) {
        Some(Value::String(_)) => Ok(()),
        Some(other) => Err(HttpError::TaskIdNotAString {
            method: method.to_owned(),
            found: other.to_string(),
        }),
        None => Err(HttpError::TaskIdMissing {
            method: method.to_owned(),
        }),
    }
}

/// One routing header against the body's value: filled in when absent, refused when it
/// disagrees or appears twice.
fn hint(
    headers: &mut HeaderMap,
    (key, name): (&'static str, &str),
    body: &str,
    what: &str,
) -> Result<(), HttpError> {
    let mut values = headers.get_all(key).iter();
    let Some(first) = values.next() else {
        if let Ok(v) = HeaderValue::from_str(&encode(body)) {
            headers.insert(HeaderName::from_static(key), v);
        }
        return Ok(());
    };
    if values.next().is_some() {
        return Err(HttpError::DuplicateHeader {
            name: name.to_owned(),
        });
    }
    let given = first
        .to_str()
        .ok()
        .and_then(decode)
        .ok_or_else(|| HttpError::InvalidHeader {
            name: name.to_owned(),
        })?;
    if given != body {
        return Err(HttpError::HeaderMismatch {
            name: name.to_owned(),
            given,
            what: what.to_owned(),
        });
    }
    Ok(())
}

/// Accept and Content-Type as Streamable HTTP needs them, where a client left them out: a
/// POST with no `Accept` (or only `*/*`) takes both JSON and SSE; one with no `Content-Type`
/// whose body is JSON is JSON. A client that named other types keeps its answer (406, 415).
fn fill_media_types(headers: &mut HeaderMap) {
    let any = headers.get_all(http::header::ACCEPT).iter().all(|v| {
        v.to_str()
            .is_ok_and(|s| s.trim() == "*/*" || s.trim().is_empty())
    });
    if any {
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
    }
    if !headers.contains_key(http::header::CONTENT_TYPE) {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
}

/// A JSON-RPC error as an HTTP response.
pub(super) fn rpc_error(status: StatusCode, id: Value, code: i64, message: String) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A request body, at most `limit` bytes (`Err`: the 413 answer).
pub(super) async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, Response> {
    let too_large = || {
        rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            Value::Null,
            -32600,
            format!("request body over {limit} bytes (the server's --max-body)"),
        )
    };
    let mut out = bytes::BytesMut::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32600,
                format!("reading the request body: {e}"),
            )
        })?;
        if chunk.len() > limit.saturating_sub(out.len()) {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// The middleware in front of `/mcp` (after the guard): a POST's body read within the limit,
/// parsed, and its headers reconciled with it.
pub(super) async fn normalize(
    State(front): State<Arc<Front>>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() != http::Method::POST {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > front.max_body) {
        return rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            Value::Null,
            -32600,
            format!(
                "request body over {} bytes (the server's --max-body)",
                front.max_body
            ),
        );
    }
    let bytes = match read_body(body, front.max_body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let msg: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32700,
                format!("parse error: the body is not JSON ({e})"),
            )
        }
    };
    fill_media_types(&mut parts.headers);
    if let Err(why) = task_id_is_a_string(&msg) {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        return rpc_error(StatusCode::OK, id, -32602, why.to_string());
    }
    if let Err(why) = reconcile(&mut parts.headers, &msg) {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        return rpc_error(
            StatusCode::BAD_REQUEST,
            id,
            HEADER_MISMATCH,
            why.to_string(),
        );
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_static(k),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn get(m: &HeaderMap, k: &str) -> Option<String> {
        m.get(k).map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn missing_routing_headers_are_filled_from_the_body() {
        let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                         "params": {"taskId": "ex_1", "_meta": {META_VERSION: "2026-07-28"}}});
        let mut m = h(&[]);
        reconcile(&mut m, &msg).unwrap();
        assert_eq!(get(&m, "mcp-method").as_deref(), Some("tasks/get"));
        assert_eq!(get(&m, "mcp-name").as_deref(), Some("ex_1"));
        assert_eq!(
            get(&m, "mcp-protocol-version").as_deref(),
            Some("2026-07-28")
        );
        // A method without a name: no Mcp-Name.
        let mut m = h(&[]);
        reconcile(&mut m, &json!({"method": "tools/list", "id": 2})).unwrap();
        assert_eq!(get(&m, "mcp-method").as_deref(), Some("tools/list"));
        assert!(m.get("mcp-name").is_none());
    }

    #[test]
    fn headers_that_agree_stay_and_headers_that_disagree_are_refused() {
        let msg = json!({"method": "tools/call", "id": 1, "params": {"name": "run_command"}});
        let mut m = h(&[("mcp-method", "tools/call"), ("mcp-name", "run_command")]);
        reconcile(&mut m, &msg).unwrap();
        let mut m = h(&[("mcp-name", "read_output")]);
        let e = reconcile(&mut m, &msg).unwrap_err().to_string();
        assert!(e.contains("does not match"), "{e}");
        let mut m = h(&[("mcp-method", "tools/list")]);
        assert!(reconcile(&mut m, &msg).is_err());
        let mut m = h(&[("mcp-name", "run_command"), ("mcp-name", "run_command")]);
        assert!(reconcile(&mut m, &msg)
            .unwrap_err()
            .to_string()
            .contains("more than one"));
        let msg = json!({"method": "tools/list", "id": 1,
                         "params": {"_meta": {META_VERSION: "2026-07-28"}}});
        let mut m = h(&[("mcp-protocol-version", "2025-11-25")]);
        assert!(reconcile(&mut m, &msg).is_err());
    }

    #[test]
    fn values_are_encoded_and_decoded_as_the_protocol_says() {
        for v in [
            "run_command",
            "ex_01",
            " lead",
            "tab\t",
            "ünï",
            "=?base64?x?=",
        ] {
            let e = encode(v);
            assert!(HeaderValue::from_str(&e).is_ok(), "{e}");
            assert_eq!(decode(&e).as_deref(), Some(v));
        }
        assert_eq!(encode("ünï"), "=?base64?w7xuw68=?=");
        assert_eq!(decode("=?base64?not base64?="), None);
        // A Base64-wrapped name that agrees with the body is accepted.
        let msg = json!({"method": "tools/call", "id": 1, "params": {"name": "ünï"}});
        let mut m = h(&[("mcp-name", "=?base64?w7xuw68=?=")]);
        reconcile(&mut m, &msg).unwrap();
    }

    #[test]
    fn media_types_are_filled_only_where_the_client_named_none() {
        let mut m = h(&[]);
        fill_media_types(&mut m);
        assert_eq!(
            get(&m, "accept").as_deref(),
            Some("application/json, text/event-stream")
        );
        assert_eq!(get(&m, "content-type").as_deref(), Some("application/json"));
        let mut m = h(&[("accept", "*/*")]);
        fill_media_types(&mut m);
        assert!(get(&m, "accept").unwrap().contains("text/event-stream"));
        let mut m = h(&[("accept", "text/html"), ("content-type", "text/plain")]);
        fill_media_types(&mut m);
        assert_eq!(get(&m, "accept").as_deref(), Some("text/html"));
        assert_eq!(get(&m, "content-type").as_deref(), Some("text/plain"));
    }
}
