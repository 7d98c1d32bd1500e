//! Lifecycle states of an execution, exactly as docs/DESIGN.md names them.

use std::fmt;
use std::str::FromStr;

/// One state of the execution lifecycle:
/// `accepted → authorized → dispatched → running → completed | failed | interrupted | unknown`,
/// then `delivered`; also `rejected` and `cancelled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// cairn took the request and gave it an execution ID.
    Accepted,
    /// Authorization said yes.
    Authorized,
    /// Authorization said no; nothing was sent.
    Rejected,
    /// The dispatch is durable in the journal and its bytes may have left (written before they do).
    Dispatched,
    /// The host's started record was seen: the command started under its supervisor.
    Running,
    /// The host reported an exit status (any status).
    Completed,
    /// Proven never started.
    Failed,
    /// Started and cannot finish (host rebooted, supervisor died) with no finish record.
    Interrupted,
    /// cairn cannot prove what happened; needs review.
    Unknown,
    /// Stopped on request.
    Cancelled,
    /// The caller has the result.
    Delivered,
}

impl State {
    pub const ALL: [State; 11] = [
        State::Accepted,
        State::Authorized,
        State::Rejected,
        State::Dispatched,
        State::Running,
        State::Completed,
        State::Failed,
        State::Interrupted,
        State::Unknown,
        State::Cancelled,
        State::Delivered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Accepted => "accepted",
            State::Authorized => "authorized",
            State::Rejected => "rejected",
            State::Dispatched => "dispatched",
            State::Running => "running",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Interrupted => "interrupted",
            State::Unknown => "unknown",
            State::Cancelled => "cancelled",
            State::Delivered => "delivered",
        }
    }

    /// Whether `recover` leaves this state alone. `unknown` is not settled: a later probe may
    /// still find the truth (a hung host that comes back), so recover looks again.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            State::Rejected
                | State::Completed
                | State::Failed
                | State::Interrupted
                | State::Cancelled
                | State::Delivered
        )
    }

    /// Whether the host has reported an outcome for this state (a result exists to deliver).
    pub fn has_result(self) -> bool {
        matches!(self, State::Completed | State::Cancelled | State::Delivered)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        State::ALL
            .iter()
            .copied()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown state {s:?}; expected one of {}", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert!("done".parse::<State>().is_err());
    }
}
