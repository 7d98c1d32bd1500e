//! Who owns an execution that is accepted but not yet dispatched, and whether that owner may
//! still send it.
//!
//! Between `accepted` and `dispatched` only the process that accepted the execution (or the one
//! that took it over, recorded by a `resumed` event) can send it. While that process lives,
//! "never dispatched" is not a conclusion: it may dispatch a moment later. Another process (a
//! second `cairn run --id X`, `attach`, `recover`, `cancel`) must wait for it or leave the
//! execution as it is, never answer `failed` (which tells a caller it is safe to send again).
//!
//! Liveness, erring towards "alive" (the safe side: an execution left pending, never one
//! concluded while it runs):
//! - this process: the execution is in the registry of executions this process is driving
//!   towards their dispatch ([`claim`]), so a gateway serving many calls in one process knows
//!   which of its own acceptances are still in flight;
//! - another process on this machine: its PID exists and is not a zombie (a reused PID reads as
//!   alive);
//! - a process on another machine: cannot be checked from here, so alive.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::event::EventKind;
use crate::id::ExecutionId;
use crate::journal::Event;

/// Executions this process is driving towards their dispatch, with how many calls claim each.
static DRIVING: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

/// This process is driving an execution towards its dispatch; dropped when it stops (the
/// execution dispatched, concluded, or the call ended in an error).
#[must_use = "the claim ends when it is dropped"]
pub struct Claim(String);

/// Claim `id` for this process until the returned guard is dropped. Claims are counted: two
/// calls of this process holding one ID (two requests racing to accept it, a resume inside
/// the call that accepted it) keep it claimed until the last one ends.
pub fn claim(id: &ExecutionId) -> Claim {
    let mut map = DRIVING.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry(id.as_str().to_owned()).or_default() += 1;
    Claim(id.as_str().to_owned())
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut map = DRIVING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.0);
            }
        }
    }
}

pub(crate) fn claimed_here(id: &str) -> bool {
    DRIVING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(id)
}

/// The owner of an execution: the client of its latest `resumed` event (a process that took
/// an accepted execution over), else the client that accepted it.
pub fn owner_of<'a>(accepted_by: &'a str, events: &'a [Event]) -> &'a str {
    events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::Resumed)
        .and_then(|e| e.evidence.get("by").and_then(|v| v.as_str()))
        .unwrap_or(accepted_by)
}

/// Whether `owner` (`pid@hostname`) may still dispatch `id`.
pub fn may_still_dispatch(id: &str, owner: &str) -> bool {
    if owner == crate::journal::client_identity() {
        return claimed_here(id);
    }
    process_alive(owner)
}

/// Whether the process `pid@hostname` may still be alive. A process on another machine cannot
/// be checked: assumed alive.
pub fn process_alive(client: &str) -> bool {
    let Some((pid, host)) = client.split_once('@') else {
        return true;
    };
    let me = crate::journal::client_identity();
    if me.split_once('@').map(|m| m.1) != Some(host) {
        return true;
    }
    let Ok(pid) = pid.parse::<i32>() else {
        return true;
    };
    if pid <= 0 {
        // kill(0) and kill(-n) address process groups: never a liveness answer.
        return true;
    }
    #[cfg(unix)]
    {
        // SAFETY: kill with signal 0 sends nothing; it only checks that `pid` exists (pid > 0 here).
        let r = unsafe { libc::kill(pid, 0) };
        if r == 0 {
            // A zombie answers kill -0: look at its state.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
            return !state.starts_with('Z');
        }
        std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, by: Option<&str>) -> Event {
        Event {
            seq: 1,
            execution_id: "x".into(),
            at: String::new(),
            kind: kind.into(),
            state: None,
            evidence: match by {
                Some(b) => serde_json::json!({"by": b}),
                None => serde_json::json!({}),
            },
            client: String::new(),
            hash: String::new(),
        }
    }

    #[test]
    fn the_latest_resume_names_the_owner() {
        let evs = [
            ev("accepted", None),
            ev("resumed", Some("7@h")),
            ev("note", None),
        ];
        assert_eq!(owner_of("1@h", &evs), "7@h");
        assert_eq!(owner_of("1@h", &evs[..1]), "1@h");
    }

    #[test]
    fn this_process_owns_only_what_it_claimed() {
        let me = crate::journal::client_identity();
        let id = ExecutionId::parse("owner-test-claim").unwrap();
        assert!(!may_still_dispatch(id.as_str(), me));
        {
            let _outer = claim(&id);
            assert!(may_still_dispatch(id.as_str(), me));
            drop(claim(&id));
            assert!(
                may_still_dispatch(id.as_str(), me),
                "an inner claim's end does not end the outer one"
            );
        }
        assert!(!may_still_dispatch(id.as_str(), me));
    }

    #[test]
    fn other_processes_are_alive_unless_proven_gone() {
        let host = crate::journal::client_identity().split_once('@').unwrap().1;
        assert!(process_alive(&format!("1@{host}")), "init lives");
        assert!(process_alive("1@some-other-machine"));
        assert!(process_alive("garbage"));
        assert!(process_alive(&format!("0@{host}")));
        assert!(process_alive(&format!("-1@{host}")));
        // A child that exited and was reaped: gone.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!process_alive(&format!("{pid}@{host}")));
    }
}
