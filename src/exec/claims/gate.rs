//! The dispatch boundary of one request, as the front that received it sees it.
//!
//! A front (the MCP server over HTTP) runs a call's executions inside [`scope`] with a
//! [`Gate`]. When the call's caller goes away before an answer (its response stream closed:
//! the 2026-07-28 revision's cancellation), the front [`Gate::close`]s it. The executor asks
//! [`cross`] at the dispatch boundary, right before it records the first `dispatched` event of
//! a new execution:
//! - the gate is open: the execution crosses, and the boundary stays held until `dispatched`
//!   is committed, so a close that comes meanwhile finds it on the far side (dispatched, never
//!   killed by a transport event);
//! - the gate was closed first: nothing is sent, and the executor concludes the execution
//!   `failed` with a reason saying so (proven never started: a re-sent call with the same
//!   intent is a new execution).
//!
//! The gate travels with the call's future as a task-local value, as a tracing span does, so
//! that every way a front runs executions (one command, a named operation on several
//! destinations) passes it without a parameter of its own. Outside a scope there is no gate.

use std::sync::{Arc, Mutex, MutexGuard};

/// The gate was closed (the caller went away, `0` says how) before this execution crossed:
/// nothing was sent for it.
///
/// Layer: the dispatch boundary of one request (this module). The executor converts it where
/// it asks [`Gate::cross`]: its Display becomes the reason the execution is concluded `failed`
/// with (`Event::DispatchRefused`), never an `ExecError`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("never dispatched: {0} before the dispatch; nothing was sent")]
pub struct GateClosed(pub String);

use crate::id::ExecutionId;

tokio::task_local! {
    static GATE: Arc<Gate>;
}

/// One request's dispatch boundary (see the module doc).
#[derive(Debug, Default)]
pub struct Gate {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Why the caller is gone, once it is.
    closed: Option<String>,
    /// Executions of this request that crossed the boundary.
    crossed: Vec<ExecutionId>,
}

/// Held while an execution's `dispatched` event is committed: a close waits for it.
pub struct Crossing<'a>(#[allow(dead_code)] MutexGuard<'a, Inner>);

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Let `id` cross (hold the result until its `dispatched` event is committed), or say why
    /// it may not: the caller is gone, and nothing may be sent for it.
    pub fn cross(&self, id: &ExecutionId) -> Result<Crossing<'_>, GateClosed> {
        let mut g = self.lock();
        if let Some(why) = &g.closed {
            return Err(GateClosed(why.clone()));
        }
        if !g.crossed.contains(id) {
            g.crossed.push(id.clone());
        }
        Ok(Crossing(g))
    }

    /// The caller is gone (`why`, in words): no execution of this request crosses from now on.
    /// Returns those that already did (their `dispatched` event is committed). Blocks while a
    /// crossing commits: call from a blocking context.
    pub fn close(&self, why: &str) -> Vec<ExecutionId> {
        let mut g = self.lock();
        g.closed.get_or_insert_with(|| why.to_owned());
        g.crossed.clone()
    }
}

/// Run `f` with `gate` as its request's boundary.
pub async fn scope<F: std::future::Future>(gate: Arc<Gate>, f: F) -> F::Output {
    GATE.scope(gate, f).await
}

/// The boundary of the request this task runs for, if a front set one.
pub fn current() -> Option<Arc<Gate>> {
    GATE.try_with(Arc::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_lets_nothing_cross_and_names_what_crossed_before() {
        let g = Gate::new();
        let (a, b) = (ExecutionId::generate(), ExecutionId::generate());
        drop(g.cross(&a).expect("open"));
        assert_eq!(
            g.close("the caller's response stream closed"),
            vec![a.clone()]
        );
        let e = g.cross(&b).err().expect("closed").to_string();
        assert!(
            e.contains("response stream closed before the dispatch; nothing was sent"),
            "{e}"
        );
        assert_eq!(g.close("again"), vec![a], "the first reason stays");
    }

    #[tokio::test]
    async fn the_gate_is_the_scope_s_alone() {
        assert!(current().is_none());
        let g = Gate::new();
        let inner = scope(g.clone(), async { current() }).await;
        assert!(inner.is_some_and(|i| Arc::ptr_eq(&i, &g)));
    }
}
