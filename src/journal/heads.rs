//! An execution's current status, kept where it is read in one lookup instead of replaying
//! every event of the execution ([`Journal::status`]).
//!
//! - **SQLite**: a row of `execution_states` per execution, written by a trigger on every
//!   insert of a transition event, in the inserting transaction, as [`next_status`] steps it.
//!   A trigger, not cairn's append code: whatever inserts an event (an older cairn, the
//!   migration's own replay) keeps the row current. Filled on first open by replaying each
//!   execution once.
//! - **PostgreSQL**: the chain head's `state` (schema version 8), set by `cairn_append_as` under
//!   the head's lock; the state before an `unknown` is read only when the state is `unknown`,
//!   from the last transition that is not (one backward read of the execution's index).
//!
//! Both equal [`status_from_states`] over the execution's transitions (tested against the
//! golden journal and random sequences).

use rusqlite::OptionalExtension;

use super::{status_from_states, Result, Status};
use crate::id::ExecutionId;
use crate::state::State;

/// The status after one more transition `s`, from `cur`: one step of [`status_from_states`].
pub fn next_status(cur: Option<Status>, s: State) -> Status {
    match cur {
        // A settled outcome stands against a later `unknown` (see `status_from_states`).
        Some(c) if s == State::Unknown && c.state.is_settled() => c,
        Some(c) if s == State::Unknown => Status {
            state: State::Unknown,
            before_unknown: if c.state == State::Unknown {
                c.before_unknown
            } else {
                Some(c.state)
            },
        },
        _ => Status {
            state: s,
            before_unknown: None,
        },
    }
}

/// The table and its trigger ([`next_status`] in SQL: in an upsert's `SET`, the row's columns
/// are its values before the update).
const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS execution_states (
    execution_id TEXT PRIMARY KEY REFERENCES executions(id),
    state TEXT NOT NULL,
    before_unknown TEXT
);
CREATE TRIGGER IF NOT EXISTS events_move_state AFTER INSERT ON events
    WHEN NEW.state IS NOT NULL
BEGIN
    INSERT INTO execution_states (execution_id, state, before_unknown)
        VALUES (NEW.execution_id, NEW.state, NULL)
    ON CONFLICT (execution_id) DO UPDATE SET
        state = CASE
            WHEN excluded.state = 'unknown' AND state IN ('rejected', 'completed', 'failed',
                'interrupted', 'cancelled', 'delivered') THEN state
            ELSE excluded.state END,
        before_unknown = CASE
            WHEN excluded.state <> 'unknown' THEN NULL
            WHEN state IN ('rejected', 'completed', 'failed', 'interrupted', 'cancelled',
                'delivered', 'unknown') THEN before_unknown
            ELSE state END;
END;
";

impl super::sqlite::Sqlite {
    /// Add `execution_states` and its trigger to a journal made before them, filled by
    /// replaying each execution's transitions once, in one transaction.
    pub(super) fn add_state_schema(&self, c: &rusqlite::Connection) -> Result<()> {
        let have = |c: &rusqlite::Connection| -> rusqlite::Result<bool> {
            c.query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'events_move_state'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
        };
        if have(c).map_err(|e| self.err(e))? {
            return Ok(());
        }
        c.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| self.err(e))?;
        let r = (|| -> rusqlite::Result<()> {
            if have(c)? {
                return Ok(());
            }
            c.execute_batch(SQLITE_SCHEMA)?;
            let mut st = c.prepare(
                "SELECT execution_id, state FROM events WHERE state IS NOT NULL
                 ORDER BY execution_id, seq",
            )?;
            let mut rows = st.query([])?;
            let mut cur: Option<(String, Vec<State>)> = None;
            let mut done = Vec::new();
            while let Some(r) = rows.next()? {
                let (id, s): (String, String) = (r.get(0)?, r.get(1)?);
                let Ok(s) = s.parse::<State>() else { continue };
                match &mut cur {
                    Some((c, states)) if *c == id => states.push(s),
                    _ => done.extend(cur.replace((id, vec![s]))),
                }
            }
            done.extend(cur);
            let mut put = c.prepare(
                "INSERT OR REPLACE INTO execution_states (execution_id, state, before_unknown)
                 VALUES (?1, ?2, ?3)",
            )?;
            for (id, states) in done {
                if let Some(s) = status_from_states(&states) {
                    put.execute(rusqlite::params![
                        id,
                        s.state.as_str(),
                        s.before_unknown.map(State::as_str)
                    ])?;
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => c.execute_batch("COMMIT").map_err(|e| self.err(e)),
            Err(e) => {
                let _ = c.execute_batch("ROLLBACK");
                Err(self.err(e))
            }
        }
    }

    /// `id`'s status from its `execution_states` row (SQLite).
    pub(super) fn status_kept(&self, id: &ExecutionId) -> Result<Option<Status>> {
        let row: Option<(String, Option<String>)> = self
            .conn()?
            .prepare_cached(
                "SELECT state, before_unknown FROM execution_states WHERE execution_id = ?1",
            )
            .and_then(|mut st| {
                st.query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(|e| self.err(e))?;
        row.map(|(s, b)| status_of(&self.location(), id, &s, b.as_deref()))
            .transpose()
    }
}

/// A stored status as [`Status`]; a state name this build does not know is a corrupt journal.
pub(super) fn status_of(
    location: &str,
    id: &ExecutionId,
    state: &str,
    before_unknown: Option<&str>,
) -> Result<Status> {
    let parse = |s: &str| {
        s.parse::<State>()
            .map_err(|e| super::JournalError::Corrupt {
                path: location.into(),
                id: id.to_string(),
                message: format!("current state: {e}"),
            })
    };
    Ok(Status {
        state: parse(state)?,
        before_unknown: before_unknown.map(parse).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::tests::{backends, rec};
    use crate::journal::{status_from_events, EventKind, Journal};
    use crate::lifecycle::TRANSITIONS;
    use rand::{Rng, SeedableRng};

    const ALL: [State; 11] = State::ALL;

    /// One step at a time equals the replay, over any sequence (legal or not: journals written
    /// before the lifecycle was enforced hold `unknown` after a settled state).
    #[test]
    fn stepping_equals_replaying_any_sequence() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(35);
        for _ in 0..5000 {
            let n = rng.random_range(0..12);
            let states: Vec<State> = (0..n)
                .map(|_| ALL[rng.random_range(0..ALL.len())])
                .collect();
            let stepped = states.iter().fold(None, |c, s| Some(next_status(c, *s)));
            assert_eq!(stepped, status_from_states(&states), "{states:?}");
        }
    }

    /// On both backends, executions walked through random legal transitions (with notes
    /// between) read the same status in one lookup as by replaying their events, after every
    /// append.
    #[test]
    fn the_kept_status_is_the_replayed_one_on_random_walks() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(37);
        for (backend, path) in backends("kept_status_random", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            for n in 0..12 {
                let r = rec(&ExecutionId::generate().to_string());
                j.accept(&r, serde_json::json!({"n": n})).unwrap();
                let mut now = State::Accepted;
                for _ in 0..rng.random_range(0..10) {
                    let next: Vec<State> = TRANSITIONS
                        .iter()
                        .filter(|(from, _, _)| *from == Some(now))
                        .map(|(_, to, _)| *to)
                        .collect();
                    if next.is_empty() {
                        break;
                    }
                    if rng.random_bool(0.3) {
                        let note = serde_json::json!({"note": n});
                        j.append(&r.id, EventKind::Correlation, None, note).unwrap();
                    }
                    let s = next[rng.random_range(0..next.len())];
                    j.append(
                        &r.id,
                        EventKind::of_state(s),
                        Some(s),
                        serde_json::json!({}),
                    )
                    .unwrap();
                    now = s;
                    let replayed = status_from_events(&j.events(&r.id).unwrap());
                    assert_eq!(j.status(&r.id).unwrap(), replayed, "{backend} {}", r.id);
                }
            }
            assert_eq!(
                j.status(&ExecutionId::generate()).unwrap(),
                None,
                "{backend}"
            );
        }
    }

    /// A SQLite journal holding sequences the lifecycle now refuses (written before it was
    /// enforced, inserted here as they were then) keeps the replayed status too, whether the
    /// events came before the table (filled on open) or after (the trigger).
    #[test]
    fn legacy_sequences_keep_the_replayed_status_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut rng = rand::rngs::StdRng::seed_from_u64(36);
        let mut ids = Vec::new();
        {
            let mut j = Journal::open(&path).unwrap();
            for _ in 0..40 {
                let r = rec(&ExecutionId::generate().to_string());
                j.accept(&r, serde_json::json!({})).unwrap();
                ids.push(r.id);
            }
        }
        let insert = |c: &rusqlite::Connection, id: &ExecutionId, s: State| {
            c.execute(
                "INSERT INTO events (execution_id, at, kind, state, evidence, client,
                                     prev_hash, hash)
                 VALUES (?1, 'at', ?2, ?2, '{}', 'test', '', '')",
                rusqlite::params![id.as_str(), s.as_str()],
            )
            .unwrap();
        };
        let c = rusqlite::Connection::open(&path).unwrap();
        // Half written with the table dropped (as before it existed), half with it.
        c.execute_batch("DROP TRIGGER events_move_state; DROP TABLE execution_states;")
            .unwrap();
        for (k, id) in ids.iter().enumerate() {
            if k == ids.len() / 2 {
                drop(Journal::open(&path).unwrap());
            }
            for _ in 0..rng.random_range(0..8) {
                insert(&c, id, ALL[rng.random_range(0..ALL.len())]);
            }
        }
        let j = Journal::open(&path).unwrap();
        for id in &ids {
            let replayed = status_from_events(&j.events(id).unwrap());
            assert_eq!(j.status(id).unwrap(), replayed, "{id}");
        }
    }
}
