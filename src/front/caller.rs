//! Who is asking, over HTTP: the actor a request's bearer token names, the MCP session it
//! belongs to, and what that caller may do (the scopes its token allows, only its own
//! executions, a cap on calls in flight). The HTTP front puts an [`HttpCaller`] on every
//! request it lets past its guard; the MCP tools and `/rpc` read it from there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::executor::ExecError;
use crate::front::gateway::{ExecuteParams, GatewayConfig, GatewayError};
use crate::front::token::Caller;
use crate::id::ExecutionId;
use crate::journal::Journal;

/// What a request carries past the guard, in its extensions (and so in the MCP request's
/// `http::request::Parts`).
#[derive(Clone, Debug)]
pub struct HttpCaller {
    pub caller: Caller,
    /// The MCP session the request belongs to (`Mcp-Session-Id`), if any.
    pub mcp_session: Option<String>,
    in_flight: Arc<InFlight>,
}

impl HttpCaller {
    /// The caller a request's token names, in `mcp_session` if any, counted in `in_flight`.
    pub fn new(caller: Caller, mcp_session: Option<String>, in_flight: Arc<InFlight>) -> Self {
        HttpCaller {
            caller,
            mcp_session,
            in_flight,
        }
    }

    /// The correlation recorded in the journal: who asked, and in which MCP session or with
    /// which request ID (a JSON-RPC id alone identifies nothing across clients).
    pub fn correlation(&self, request_id: &str) -> String {
        match &self.mcp_session {
            Some(s) => format!(
                "actor={} mcp-session={s} request={request_id}",
                self.caller.actor
            ),
            None => format!("actor={} request={request_id}", self.caller.actor),
        }
    }

    /// The correlation of one MCP tool call: [`HttpCaller::correlation`], and without a session
    /// (the 2026-07-28 revision, where a client's request IDs repeat across its connections) a
    /// nonce of this call, so that two calls of one actor with the same request ID in flight
    /// together are never taken for each other (a task is found by its call's correlation).
    pub fn call_correlation(&self, request_id: &str) -> String {
        let c = self.correlation(request_id);
        match &self.mcp_session {
            Some(_) => c,
            None => format!("{c} call={:016x}", rand::random::<u64>()),
        }
    }

    /// A slot for one call in flight, or the error saying the actor has too many.
    pub fn slot(&self) -> Result<Slot, GatewayError> {
        self.in_flight.acquire(&self.caller.actor)
    }

    /// The gateway configuration this caller's requests run with: its actor, and the server's
    /// session.
    pub fn config(&self, base: &GatewayConfig) -> GatewayConfig {
        let mut c = base.clone();
        c.actor = self.caller.actor.clone();
        c
    }
}

/// Calls in flight per actor.
#[derive(Debug, Default)]
pub struct InFlight {
    cap: usize,
    by_actor: Mutex<HashMap<String, usize>>,
}

/// One call in flight; the count drops when this does.
pub struct Slot {
    in_flight: Arc<InFlight>,
    actor: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self
            .in_flight
            .by_actor
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.actor) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.actor);
            }
        }
    }
}

impl InFlight {
    /// A count of calls in flight per actor, refusing past `cap` (at least 1).
    pub fn with_cap(cap: usize) -> Arc<InFlight> {
        Arc::new(InFlight {
            cap: cap.max(1),
            ..Default::default()
        })
    }

    fn acquire(self: &Arc<Self>, actor: &str) -> Result<Slot, GatewayError> {
        let mut m = self.by_actor.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(actor.to_owned()).or_insert(0);
        if *n >= self.cap {
            return Err(GatewayError {
                code: -32005,
                message: format!(
                    "actor {actor} already has {} calls in flight, the most this server allows \
                     (--max-in-flight); nothing was started: retry when one has finished",
                    self.cap
                ),
                data: Some(json!({"in_flight": *n, "cap": self.cap})),
            });
        }
        *n += 1;
        Ok(Slot {
            in_flight: self.clone(),
            actor: actor.to_owned(),
        })
    }
}

/// The HTTP caller of an MCP request (`None` on stdio).
pub fn caller_of(ext: &rmcp::model::Extensions) -> Option<HttpCaller> {
    ext.get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<HttpCaller>())
        .cloned()
}

/// What an HTTP caller may do with a `run_command` / `execute`: act in a scope its token
/// allows (a token with a scope prefix and no scope given acts in the prefix itself), and name
/// an execution ID only of its own.
pub fn admit_execute(
    cfg: &GatewayConfig,
    caller: &HttpCaller,
    p: &mut ExecuteParams,
) -> Result<(), GatewayError> {
    admit_scope(caller, &mut p.scope)?;
    if let Some(id) = &p.execution_id {
        if let Ok(id) = ExecutionId::parse(id) {
            // A new ID is the caller's to take; an existing one only if it is its own.
            if !matches!(owner(cfg, &id)?, Owner::Nobody) {
                admit_read(cfg, caller, &id)?;
            }
        }
    }
    Ok(())
}

/// Who holds an execution ID in the journal.
enum Owner {
    Nobody,
    Actor(Option<String>),
}

fn owner(cfg: &GatewayConfig, id: &ExecutionId) -> Result<Owner, GatewayError> {
    let j = Journal::open(&cfg.journal).map_err(ExecError::from)?;
    if let Some(c) = j.intent_of(id).map_err(ExecError::from)? {
        return Ok(Owner::Actor(Some(c.actor)));
    }
    if j.execution(id).map_err(ExecError::from)?.is_none() {
        return Ok(Owner::Nobody);
    }
    // A host never identified has no intent: who asked is in its `accepted` event. Without
    // it (an older journal), the execution is nobody's to read over HTTP.
    let events = j.events(id).map_err(ExecError::from)?;
    let asked_by = events
        .iter()
        .find(|e| e.kind == "accepted")
        .and_then(|e| e.evidence.get("actor")?.as_str().map(str::to_owned));
    Ok(Owner::Actor(asked_by))
}

/// The scope an HTTP caller acts in: its token's prefix when none is given; a given one must
/// start with it.
pub fn admit_scope(caller: &HttpCaller, scope: &mut Option<String>) -> Result<(), GatewayError> {
    if let Some(prefix) = &caller.caller.scope_prefix {
        match scope {
            None => *scope = Some(prefix.clone()),
            Some(s) if s.starts_with(prefix.as_str()) => {}
            Some(s) => {
                return Err(GatewayError::params(format!(
                "scope {s:?}: the token of actor {} acts only in scopes starting with {prefix:?}",
                caller.caller.actor
            )))
            }
        }
    }
    Ok(())
}

/// An HTTP caller sees only its own executions: another actor's is "not found", as one that
/// does not exist (no oracle for IDs).
pub fn admit_read(
    cfg: &GatewayConfig,
    caller: &HttpCaller,
    id: &ExecutionId,
) -> Result<(), GatewayError> {
    if let Owner::Actor(Some(a)) = owner(cfg, id)? {
        if a == caller.caller.actor {
            return Ok(());
        }
    }
    // Another actor's execution and no execution at all get one answer, so a caller learns
    // neither that an ID exists nor where the server keeps its journal.
    Err(GatewayError {
        code: -32004,
        message: format!("no execution {id} of actor {}", caller.caller.actor),
        data: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_on_calls_in_flight_per_actor_refuses_past_it_and_frees_on_drop() {
        let f = InFlight::with_cap(2);
        let a = f.acquire("alice").unwrap();
        let _b = f.acquire("alice").unwrap();
        let e = f.acquire("alice").err().expect("the third is refused");
        assert!(e.message.contains("2 calls in flight"), "{}", e.message);
        let _c = f.acquire("bob").expect("another actor has its own count");
        drop(a);
        assert!(f.acquire("alice").is_ok());
    }
}
