//! Admission: a request becomes an execution (or attaches to one it matches): the ID reused,
//! first contact, the intent and its fingerprint, accept-or-match, authorization, then the
//! dispatch handed to [`super::drive`]. Also the secrets a dispatch sends and the correlation
//! waiters a front is told through.

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::admission::{self, Ask, Class, Facts, Owner, Recorded, Route};
use crate::approve::ApprovalRequest;
use crate::evidence::{AcceptedIntent, Evidence};
use crate::id::ExecutionId;
use crate::intent::{Intent, IntentKey, OpClass};
use crate::journal::{now_rfc3339, AcceptOrMatch, Candidate, ExecutionRecord, IntentColumns};
use crate::marker::{self};
use crate::recovery::Prior;
use crate::ssh::Target;
use crate::state::State;

use super::drive::{place_of, DriveMode};
use super::*;

/// Calls waiting to learn which execution their correlation gets recorded against
/// ([`await_correlation`]). A front that answers once a call's execution is accepted (an MCP
/// task) is told by the executor that recorded it, right after the commit, instead of asking
/// the journal over and over: with a thousand calls waiting, those queries took every thread of
/// the blocking pool and starved the very commits they waited for.
type CorrelationWaiters =
    std::collections::HashMap<String, Vec<tokio::sync::oneshot::Sender<ExecutionId>>>;
fn correlation_waiters() -> std::sync::MutexGuard<'static, CorrelationWaiters> {
    static W: std::sync::OnceLock<std::sync::Mutex<CorrelationWaiters>> =
        std::sync::OnceLock::new();
    W.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Be told the execution `correlation` is next recorded against (committed) by an executor of
/// this process. Register before the call can record it; what was recorded before is in the
/// journal. A receiver dropped unanswered is pruned by [`forget_correlation`].
pub fn await_correlation(correlation: &str) -> tokio::sync::oneshot::Receiver<ExecutionId> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    correlation_waiters()
        .entry(correlation.to_owned())
        .or_default()
        .push(tx);
    rx
}

/// Drop the waiters of `correlation` that stopped waiting.
pub fn forget_correlation(correlation: &str) {
    let mut w = correlation_waiters();
    if let Some(list) = w.get_mut(correlation) {
        list.retain(|tx| !tx.is_closed());
        if list.is_empty() {
            w.remove(correlation);
        }
    }
}

/// `correlation` was just committed against `id`: wake whoever waits for it.
fn correlation_recorded(correlation: Option<&str>, id: &ExecutionId) {
    let Some(c) = correlation else { return };
    let waiting = correlation_waiters().remove(c);
    for tx in waiting.into_iter().flatten() {
        let _ = tx.send(id.clone());
    }
}

pub(super) fn digest(cmd: &[u8]) -> String {
    hex::encode(Sha256::digest(cmd))
}

/// Which earlier execution (newest first) a request with the same intent attaches to:
/// one that is accepted, authorized, dispatched, running, or has a result not yet delivered;
/// or one whose outcome is `unknown`/`interrupted` (the review record), unless its class lets
/// a retry run again (read-only, within limits). Failed, rejected and delivered ones do not
/// hold a match: a request after them is a new execution ([`admission::holds_match`]).
pub fn choose_match(cands: &[Candidate]) -> Option<usize> {
    let unsettled = cands
        .iter()
        .filter(|c| matches!(c.status.state, State::Unknown | State::Interrupted))
        .count();
    cands.iter().position(|c| {
        let asks_rule = matches!(c.status.state, State::Unknown | State::Interrupted);
        admission::holds_match(c.status.state, class_of(c, asks_rule), unsettled)
    })
}

/// The admission table's class of `c`'s recorded class name. Where the table asks its rule
/// after an unknown outcome (`asks_rule`), a name this build does not parse is said
/// ([`crate::intent::class_recorded`]); elsewhere the class decides nothing and is read quietly.
fn class_of(c: &Candidate, asks_rule: bool) -> Class {
    if asks_rule {
        crate::intent::class_recorded(&c.class)
    } else {
        Class::from_recorded(&c.class)
    }
}

/// A request on its way to becoming an execution: what `execute` made of it before the
/// journal saw it.
struct Admitting<'a> {
    req: &'a RunRequest,
    intent: &'a Intent,
    target: Target,
    /// The command as sent (`cwd`/`env` wrapped around the requested one) and its digest.
    command: Vec<u8>,
    digest: String,
    /// The secret `export` lines to send after the command, if the request has any.
    secret_blob: Option<Vec<u8>>,
}

impl Admitting<'_> {
    /// The new execution's record under `id`.
    fn record(&self, id: &ExecutionId) -> ExecutionRecord {
        ExecutionRecord {
            id: id.clone(),
            created_at: now_rfc3339(),
            destination: self.req.destination.clone(),
            host: self.target.hostname.clone(),
            port: self.target.port,
            user: self.target.user.clone(),
            command: self.command.clone(),
            command_digest: self.digest.clone(),
            remote_dir: self.req.remote_dir.clone(),
            timeout_secs: self.req.timeout_secs,
            client: crate::journal::client_identity().to_owned(),
        }
    }
}

/// The intent of an admitted request, as the journal is asked to accept or match it.
struct Accepting {
    cols: IntentColumns,
    /// The fingerprint of the record's first version (`fingerprint_v1`), matched as well.
    legacy_fp: String,
    evidence: serde_json::Value,
    match_evidence: serde_json::Value,
}

/// What the approver is asked about, besides the target and the host key.
struct Asked<'a> {
    actor: &'a str,
    scope: &'a str,
    class: OpClass,
    destination: &'a str,
    command: &'a [u8],
}

/// An accept that lost the race for its execution ID (another process sending the same ID
/// accepted it between our look-up and our insert) says so plainly, instead of a database
/// error: the other process runs it, once. (Attaching here could meet it accepted but not yet
/// dispatched, which reads as "never dispatched".)
fn lost_id_race(e: crate::journal::JournalError, id: &ExecutionId) -> ExecError {
    if e.is_duplicate_id() {
        ExecError::Refused(format!(
            "execution {id} was accepted by another process at the same moment; it runs there, \
             once. Follow it with `cairn attach {id}` or `cairn status {id}`"
        ))
    } else {
        e.into()
    }
}

/// Secret variables (`--secret-env NAME`): values from cairn's own environment, encoded for
/// the host as `export NAME='value'` lines that travel after the command on the dispatch's
/// stdin. They are never journaled, written to the marker, or put in argv; see
/// `docs/GATEWAYS.md` for the host side.
fn secret_blob(intent: &Intent) -> Result<Option<Vec<u8>>, ExecError> {
    if intent.secret_env.is_empty() {
        return Ok(None);
    }
    let mut blob = Vec::new();
    for name in &intent.secret_env {
        let v = std::env::var_os(name).ok_or_else(|| {
            ExecError::Setup(format!(
                "secret variable {name} is not set in cairn's environment"
            ))
        })?;
        #[cfg(unix)]
        let bytes = {
            use std::os::unix::ffi::OsStrExt;
            v.as_bytes().to_vec()
        };
        #[cfg(not(unix))]
        let bytes = v.to_string_lossy().into_owned().into_bytes();
        if bytes.contains(&0) {
            return Err(ExecError::Setup(format!(
                "secret {name} contains a NUL byte"
            )));
        }
        blob.extend_from_slice(format!("export {name}=").as_bytes());
        blob.extend_from_slice(&crate::intent::quote_word(&bytes));
        blob.push(b'\n');
    }
    Ok(Some(blob))
}

impl Executor {
    /// `cairn run`: accept, dispatch, stream, survive connection loss, conclude, deliver.
    /// The intent is the local user's, class `remote-command`, default scope.
    pub async fn run(
        &mut self,
        req: RunRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let intent = Intent {
            actor: crate::intent::local_actor("local"),
            ..Intent::default()
        };
        self.execute(req, intent, sink).await
    }

    /// Accept (or match), authorize, dispatch, stream, survive connection loss, conclude.
    ///
    /// A request whose intent fingerprint, actor and scope match an earlier execution that
    /// is still in its retention window and not yet delivered attaches to that execution
    /// (live output, the stored result, or its review record) instead of starting another;
    /// see [`crate::intent`] and docs/DESIGN.md, intent matching.
    ///
    /// Admission in its order (reuse by ID, first contact, the intent and its evidence,
    /// accept-or-match with its bounded retry, attach): each step hands the next the record,
    /// the connection and the fingerprint it made, and the order is the guarantee.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = tracing::field::Empty))]
    pub async fn execute(
        &mut self,
        req: RunRequest,
        intent: Intent,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        marker::validate_remote_dir(&req.remote_dir).map_err(ExecError::InvalidRequest)?;
        intent.validate().map_err(ExecError::InvalidRequest)?;
        let secret_blob = secret_blob(&intent)?;
        let target = crate::ssh::resolve(&req.destination, &self.link.connect)?;
        let command = intent.wrap_command(&req.command);
        let a = Admitting {
            digest: digest(&command),
            req: &req,
            intent: &intent,
            target,
            command,
            secret_blob,
        };

        if let Some(id) = &req.id {
            if let Some(rec) = self.journal.execution(id)? {
                return self.reuse_id(&a, id, &rec, sink).await;
            }
        }

        let id = req.id.clone().unwrap_or_else(ExecutionId::generate);
        // Claimed before it is accepted, so that no moment exists in which the journal holds
        // it accepted and this process does not count as its live owner.
        let _claim = crate::owner::claim(&id);
        let rec = a.record(&id);
        let mut run = Run::new(rec.clone());
        // How it reaches the host, for every later connection made for it.
        let reach = crate::reach::Reach::of(&a.target, &self.link.connect, &req.remote_dir);

        let conn_idx = match self.first_contact(&a, &mut run, &reach).await? {
            Ok(i) => i,
            Err(o) => return Ok(o),
        };
        let fp = self.link.host_key(conn_idx).to_owned();
        run.host_key = Some(fp.clone());

        let acc = self.accepting(&a, &rec, &reach, &fp)?;
        if let Some(o) = self.accept_or_attach(&a, &rec, &acc, sink).await? {
            return Ok(o);
        }
        if let Some(blob) = a.secret_blob.clone() {
            self.secrets.insert(id.to_string(), blob);
        }
        self.correlate(&id, &intent, true)?;

        let asked = Asked {
            actor: &acc.cols.actor,
            scope: &acc.cols.scope,
            class: intent.class,
            destination: &req.destination,
            command: &req.command,
        };
        self.authorize_and_dispatch(&a.target, &mut run, conn_idx, &asked, req.detach, sink)
            .await
    }

    /// `execute` of an ID the journal already holds: the same operation again is never a
    /// second run (replayed from the start); another operation under that ID is refused.
    async fn reuse_id(
        &mut self,
        a: &Admitting<'_>,
        id: &ExecutionId,
        rec: &ExecutionRecord,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let target = &a.target;
        let same_operation = rec.command_digest == a.digest
            && rec.host == target.hostname
            && rec.port == target.port
            && rec.user == target.user;
        let facts = Facts {
            // (a row is all the table asks of a reused ID: its state, class, owner and
            // redrives decide nothing here, and are not read)
            recorded: Recorded::Stateless,
            class: Class::Unrecognized,
            owner: Owner::Nobody,
            redrives: 0,
            detached: false,
        };
        if admission::route(Ask::SameId { same_operation }, &facts) != Route::Attach {
            return Err(ExecError::IdConflict {
                id: id.to_string(),
                recorded: format!(
                    "{}@{}:{} -- {}",
                    rec.user,
                    rec.host,
                    rec.port,
                    rec.command_display()
                ),
                requested: format!(
                    "{}@{}:{} -- {}",
                    target.user,
                    target.hostname,
                    target.port,
                    String::from_utf8_lossy(&a.command)
                ),
            });
        }
        // The same operation again: never a second run. Replay from the start.
        tracing::Span::current().record("execution_id", tracing::field::display(id));
        self.journal.append_evidence(
            id,
            Evidence::RequestReused {
                by: crate::journal::client_identity(),
                correlation_id: a.intent.correlation_id.as_deref(),
                session_id: self.session_id.as_deref(),
                decision: (),
            },
        )?;
        correlation_recorded(a.intent.correlation_id.as_deref(), id);
        if let Some(blob) = &a.secret_blob {
            self.secrets.insert(id.to_string(), blob.clone());
        }
        let mut o = self.attach_from(id, sink, (0, 0), !a.req.detach).await?;
        o.attached = true;
        Ok(o)
    }

    /// First contact: connect and learn the host's key (the host identity in the intent).
    /// A failure here is a proven "never started": nothing was sent. The execution is
    /// recorded without a fingerprint (the host was never identified), so it matches nothing;
    /// `Ok(Err)` is its outcome.
    async fn first_contact(
        &mut self,
        a: &Admitting<'_>,
        run: &mut Run,
        reach: &crate::reach::Reach,
    ) -> Result<Result<usize, Outcome>, ExecError> {
        let e = match self.link.connection(&a.target).await {
            Ok(i) => return Ok(Ok(i)),
            Err(e) => e,
        };
        let id = run.rec.id.clone();
        tracing::Span::current().record("execution_id", tracing::field::display(&id));
        let actor = a.intent.actor.trim();
        let evidence = Evidence::Accepted {
            record: crate::journal::accepted_evidence(&run.rec),
            connection: Some(reach),
            intent: None,
            asked_by: Some(actor),
        };
        self.journal
            .accept(&run.rec, evidence.to_value())
            .map_err(|e| lost_id_race(e, &id))?;
        self.correlate(&id, a.intent, true)?;
        // An outcome, not an error: `--json` callers get the object, and the reason
        // carries the error (host key, auth, unreachable) for people.
        self.conclude(run, State::Failed, &format!("never dispatched: {e}"))
            .map(Err)
    }

    /// The intent: the keyed fingerprint of the canonical operation record on the host whose
    /// key is `fp`, its columns, and the evidence of accepting it or matching an earlier one.
    fn accepting(
        &mut self,
        a: &Admitting<'_>,
        rec: &ExecutionRecord,
        reach: &crate::reach::Reach,
        fp: &str,
    ) -> Result<Accepting, ExecError> {
        let (target, intent) = (&a.target, a.intent);
        let key = self.intent_key()?;
        let host = crate::intent::canonical_host(&target.hostname, target.port);
        let op = intent.record(fp, &host, &target.user, &a.req.command);
        let fingerprint = op.fingerprint(&key);
        let legacy_fp = op.fingerprint_v1(&key);
        let cols = IntentColumns {
            fingerprint: fingerprint.clone(),
            actor: op.actor_canonical(),
            scope: op.scope_canonical(),
            class: intent.class.as_str().to_owned(),
            retention_secs: intent.retention_secs(),
            accepted_ms: crate::journal::now_ms(),
            session_id: self.session_id.clone(),
            intent: op.display_json(),
        };
        let evidence = Evidence::Accepted {
            record: crate::journal::accepted_evidence(rec),
            connection: Some(reach),
            intent: Some(AcceptedIntent {
                fingerprint: &fingerprint,
                actor: &cols.actor,
                scope: &cols.scope,
                class: &cols.class,
                retention_secs: cols.retention_secs,
                session_id: cols.session_id.as_deref(),
                intent: &cols.intent,
            }),
            asked_by: None,
        }
        .to_value();
        let match_evidence = Evidence::IntentMatched {
            by: crate::journal::client_identity(),
            session_id: self.session_id.as_deref(),
            correlation_id: intent.correlation_id.as_deref(),
            fingerprint: &fingerprint,
            decision: (),
        }
        .to_value();
        Ok(Accepting {
            cols,
            legacy_fp,
            evidence,
            match_evidence,
        })
    }

    /// Accept `rec`, or attach to the earlier execution its intent matches (`Some`: that
    /// one's outcome). A match proven never dispatched gives way: accepting is tried again,
    /// at most five times.
    async fn accept_or_attach(
        &mut self,
        a: &Admitting<'_>,
        rec: &ExecutionRecord,
        acc: &Accepting,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<Outcome>, ExecError> {
        let id = &rec.id;
        let legacy = crate::journal::LegacyIntent {
            fingerprint: &acc.legacy_fp,
            host: &a.target.hostname,
            port: a.target.port,
        };
        for _ in 0..5 {
            let mut cols = acc.cols.clone();
            cols.accepted_ms = crate::journal::now_ms();
            match self
                .journal
                .accept_or_match_with(
                    rec,
                    &cols,
                    Some(legacy),
                    acc.evidence.clone(),
                    acc.match_evidence.clone(),
                    choose_match,
                )
                .map_err(|e| lost_id_race(e, id))?
            {
                AcceptOrMatch::Accepted(_) => {
                    tracing::Span::current().record("execution_id", tracing::field::display(id));
                    return Ok(None);
                }
                AcceptOrMatch::Matched(c) => {
                    // (the match evidence, with the correlation, was committed with the match)
                    correlation_recorded(a.intent.correlation_id.as_deref(), &c.id);
                    tracing::Span::current().record("execution_id", tracing::field::display(&c.id));
                    tracing::info!(
                        "cairn: same intent as {} ({}): attaching to it instead of running again",
                        c.id,
                        c.status.state
                    );
                    if let Some(blob) = &a.secret_blob {
                        self.secrets.insert(c.id.to_string(), blob.clone());
                    }
                    if let Some(o) = self.attach_matched(&c, a.req.detach, sink).await? {
                        return Ok(Some(o));
                    }
                    // The earlier one was proven never dispatched: accept this one.
                }
            }
        }
        Err(ExecError::Internal(
            "intent matching did not settle after 5 attempts".into(),
        ))
    }

    /// An execution accepted in the journal whose client stopped before it asked for
    /// authorization or sent a byte (`cairn batch resume` of a member left `accepted`): ask the
    /// approver now, as `execute` would have, and dispatch it under its own ID if allowed.
    /// `command` is the command as requested (before `cwd`/`env` were wrapped around it) and
    /// `intent` the request's. Anything past `accepted`, still owned by a process that may
    /// dispatch it, or accepted without an intent, is attached to instead (the admission
    /// table's [`Ask::Approve`]).
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn authorize_accepted(
        &mut self,
        id: &ExecutionId,
        command: &[u8],
        intent: &Intent,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        match self.approve_route(id)? {
            Route::Authorize => {}
            Route::Attach => return self.attach(id, sink).await,
            other => {
                return Err(ExecError::Internal(format!(
                    "the admission table routed the authorization of {id} to {other:?}"
                )))
            }
        }
        // This process owns it from here (the `resumed` event names it for other processes).
        let _claim = crate::owner::claim(id);
        let mut run = self.load(id)?;
        self.journal.append_evidence(
            id,
            Evidence::Resumed {
                by: crate::journal::client_identity(),
                why: (),
            },
        )?;
        self.ask_then_dispatch(&mut run, command, intent, sink)
            .await
    }

    /// Where [`Executor::authorize_accepted`] goes for `id` ([`Ask::Approve`]). Its owner and
    /// its intent are read only while the state alone would have it authorized; an owner that
    /// may still dispatch it is [`Owner::Live`].
    fn approve_route(&self, id: &ExecutionId) -> Result<Route, ExecError> {
        let recorded = match self.journal.status(id)? {
            Some(s) => Recorded::At(s.state),
            None => Recorded::Stateless,
        };
        let mut facts = Facts {
            recorded,
            // (the class decides nothing here)
            class: Class::RemoteCommand,
            owner: Owner::Nobody,
            redrives: 0,
            detached: false,
        };
        let mut ask = Ask::Approve { has_intent: true };
        if admission::route(ask, &facts) == Route::Authorize {
            if self.owner_may_dispatch(id)?.is_some() {
                facts.owner = Owner::Live;
            }
            ask = Ask::Approve {
                has_intent: self.journal.intent_of(id)?.is_some(),
            };
        }
        Ok(admission::route(ask, &facts))
    }

    /// An execution never authorized: connect (learning the host key), ask the approver about
    /// `command` with `intent`, and dispatch it under its own ID if allowed.
    pub(super) async fn ask_then_dispatch(
        &mut self,
        run: &mut Run,
        command: &[u8],
        intent: &Intent,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let target = self.target_for(run)?;
        let conn_idx = match self.link.connection(&target).await {
            Ok(i) => i,
            Err(e) => return self.conclude(run, State::Failed, &format!("never dispatched: {e}")),
        };
        let fp = self.link.host_key(conn_idx).to_owned();
        run.host_key = Some(fp.clone());
        let host = crate::intent::canonical_host(&target.hostname, target.port);
        let op = intent.record(&fp, &host, &target.user, command);
        let (actor, scope) = (op.actor_canonical(), op.scope_canonical());
        let destination = run.rec.destination.clone();
        let asked = Asked {
            actor: &actor,
            scope: &scope,
            class: intent.class,
            destination: &destination,
            command,
        };
        self.authorize_and_dispatch(&target, run, conn_idx, &asked, false, sink)
            .await
    }

    /// Authorization (asked once, the decision is evidence), the host's epoch, then the
    /// dispatch: the part of `execute` after the execution was accepted.
    async fn authorize_and_dispatch(
        &mut self,
        target: &Target,
        run: &mut Run,
        conn_idx: usize,
        asked: &Asked<'_>,
        detach: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let id = run.rec.id.clone();
        let fp = self.link.host_key(conn_idx).to_owned();
        let target_text = format!("{}@{}:{}", target.user, target.hostname, target.port);
        let decision = self.approver.decide(&ApprovalRequest {
            execution_id: id.as_str(),
            actor: asked.actor,
            destination: asked.destination,
            target: &target_text,
            account: &target.user,
            host_key: &fp,
            class: asked.class,
            scope: asked.scope,
            command: asked.command,
        });
        let at = now_rfc3339();
        let decided = Evidence::Decided {
            allow: decision.allow,
            by: &decision.by,
            rule: decision.rule.as_deref(),
            reason: &decision.reason,
            at: &at,
            host_key: &fp,
            actor: asked.actor,
        }
        .into_event();
        if !decision.allow {
            let (kind, state, value) = decided;
            self.journal.append(&id, kind, state, value)?;
            run.m.set_prior(Prior::Settled);
            let mut o = self.outcome_from_journal(run)?;
            o.reason = Some(format!(
                "not authorized ({}): {}; nothing was sent",
                decision.by, decision.reason
            ));
            return Ok(o);
        }
        run.held.push(decided);
        // The epoch last seen at this host; on first contact, the one it announces now. The
        // reply to the dispatch says which epoch it really ran under (see `drive`).
        let place = place_of(&run.rec, &fp);
        let epoch = match self.journal.host_epoch_at(&place)? {
            Some(e) => e,
            None => match self.link.hello(conn_idx, &run.rec.remote_dir).await {
                Ok(h) => {
                    self.note_epoch(run, &h.epoch)?;
                    h.epoch
                }
                Err(why) => {
                    let o = self.conclude(
                        run,
                        State::Failed,
                        &format!("never dispatched: preparing the host failed: {why}"),
                    )?;
                    return Ok(o);
                }
            },
        };
        run.last_seen_epoch = Some(epoch.clone());
        run.dispatch_epoch = Some(epoch);
        self.drive(target, run, DriveMode::Dispatch { detach }, sink)
            .await
    }

    /// The secret `export` lines to send after the command for a dispatch of `id`: those of
    /// the request this process holds, else read again by name from this process's
    /// environment (a `recover` in another process). Refuses rather than run without them.
    pub(super) fn secrets_for(&mut self, id: &ExecutionId) -> Result<Vec<u8>, ExecError> {
        if let Some(b) = self.secrets.get(id.as_str()) {
            return Ok(b.clone());
        }
        let names: std::collections::BTreeSet<String> = self
            .journal
            .intent_of(id)?
            .and_then(|i| {
                serde_json::from_value(i.intent.get("secret_env").cloned().unwrap_or_default()).ok()
            })
            .unwrap_or_default();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let intent = Intent {
            secret_env: names,
            ..Intent::default()
        };
        let blob = secret_blob(&intent)
            .map_err(|e| ExecError::Setup(format!("cannot dispatch {id}: {e}; nothing was sent")))?
            .unwrap_or_default();
        self.secrets.insert(id.to_string(), blob.clone());
        Ok(blob)
    }

    /// The fingerprint key, loaded (or created) once.
    pub(super) fn intent_key(&mut self) -> Result<IntentKey, ExecError> {
        if let Some(k) = &self.intent_key {
            return Ok(k.clone());
        }
        let path = match self.intent_key_path.clone() {
            Some(p) => p,
            None => IntentKey::default_path(self.journal.path()).ok_or_else(|| {
                ExecError::Setup(
                    "a PostgreSQL journal is shared by replicas, and they match one intent only \
                     under one intent key: give every replica the same key file with \
                     --intent-key FILE or CAIRN_INTENT_KEY"
                        .into(),
                )
            })?,
        };
        let k = IntentKey::load_or_create(&path)?;
        self.intent_key = Some(k.clone());
        Ok(k)
    }

    /// Record the caller's correlation ID (a JSON-RPC id) against an execution.
    fn correlate(&mut self, id: &ExecutionId, intent: &Intent, new: bool) -> Result<(), ExecError> {
        if let Some(c) = &intent.correlation_id {
            self.journal.append_evidence(
                id,
                Evidence::Correlation {
                    correlation_id: c,
                    session_id: self.session_id.as_deref(),
                    new_execution: new,
                },
            )?;
            correlation_recorded(Some(c), id);
        }
        Ok(())
    }

    /// A request matched `c`: attach to it according to its state and class (the admission
    /// table's [`Ask::Matched`]). `None` when it turned out never to have been dispatched (its
    /// owner died first): accept anew.
    async fn attach_matched(
        &mut self,
        c: &Candidate,
        detach: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<Outcome>, ExecError> {
        let (state, route) = self.matched_route(c).await?;
        let o = match route {
            Route::Recover => {
                // Never dispatched, and its owner is gone (or silent past the deadline): the
                // `dispatched` event is durable before a byte leaves, so nothing was sent.
                let o = self.recover_one(&c.id, false).await?;
                if o.state == State::Failed {
                    return Ok(None);
                }
                o
            }
            // proven never started
            Route::New => return Ok(None),
            Route::Review => self.review_outcome(&c.id)?,
            Route::RetryUnderSameId => {
                let o = self.attach_from(&c.id, sink, (0, 0), !detach).await?;
                // Held by its live owner on another replica: that owner decides, not this
                // call (nothing is appended or sent from here).
                if o.state == State::Unknown && o.held_by.is_none() {
                    // Idempotent: running it again is harmless; do it under the same
                    // execution ID (the start guard still holds where the marker exists).
                    self.journal.append_evidence(
                        &c.id,
                        Evidence::RetrySameId {
                            class: OpClass::Idempotent,
                            reason: (),
                        },
                    )?;
                    self.redispatch(&c.id, detach, sink).await?
                } else {
                    o
                }
            }
            Route::Attach => {
                let o = self.attach_from(&c.id, sink, (0, 0), !detach).await?;
                // An `unknown` probed again and still unknown goes to review (held by its live
                // owner on another replica: nothing concluded here).
                if state == State::Unknown && o.state == State::Unknown && o.held_by.is_none() {
                    self.review_outcome(&c.id)?
                } else {
                    o
                }
            }
            other => {
                return Err(ExecError::Internal(format!(
                    "the admission table routed a matched request for {} to {other:?}",
                    c.id
                )))
            }
        };
        Ok(Some(self.mark_attached(o)))
    }

    /// Where a request that matched `c` goes ([`Ask::Matched`]), and the state that decided it.
    /// An execution another process is still starting: give it time to reach the host, so that
    /// we watch its dispatch rather than race it with our own (the start guard would make that
    /// harmless, but not quiet). Its owner is looked up only while it could make the request
    /// wait; once the table stops waiting, what the journal holds then decides.
    async fn matched_route(&mut self, c: &Candidate) -> Result<(State, Route), ExecError> {
        let deadline = Instant::now() + self.link.connect.connect_timeout + Duration::from_secs(30);
        let mut state = c.status.state;
        loop {
            let owner_wait_over = Instant::now() >= deadline;
            let pending = matches!(
                state,
                State::Accepted | State::Authorized | State::Dispatched
            );
            let owner = if pending && !owner_wait_over && self.owner_may_dispatch(&c.id)?.is_some()
            {
                Owner::Live
            } else {
                Owner::Nobody
            };
            let facts = Facts {
                recorded: Recorded::At(state),
                // (the class decides nothing while the owner may make it wait)
                class: class_of(c, false),
                owner,
                redrives: 0,
                detached: false,
            };
            if admission::route(Ask::Matched { owner_wait_over }, &facts) != Route::Wait {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            state = self
                .journal
                .status(&c.id)?
                .map(|s| s.state)
                .unwrap_or(state);
        }
        let status = self.journal.status(&c.id)?;
        let state = status.as_ref().map(|s| s.state).unwrap_or(state);
        let facts = Facts {
            recorded: Recorded::At(state),
            // (the class rule is asked of an `unknown` one alone)
            class: class_of(c, state == State::Unknown),
            // the wait is over: the owner is not asked again
            owner: Owner::Nobody,
            redrives: 0,
            detached: false,
        };
        let ask = Ask::Matched {
            owner_wait_over: true,
        };
        Ok((state, admission::route(ask, &facts)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_correlation_wakes_only_those_waiting_for_it_and_once() {
        let (a, b) = (ExecutionId::generate(), ExecutionId::generate());
        // recorded before anyone waited: nobody is told (the journal has it)
        correlation_recorded(Some("test-corr-early"), &a);
        let mut early = await_correlation("test-corr-early");
        assert!(early.try_recv().is_err());
        let mut one = await_correlation("test-corr-x");
        let mut two = await_correlation("test-corr-x");
        let mut other = await_correlation("test-corr-y");
        correlation_recorded(Some("test-corr-x"), &a);
        correlation_recorded(None, &b);
        assert_eq!(one.try_recv().unwrap(), a);
        assert_eq!(two.try_recv().unwrap(), a);
        assert!(other.try_recv().is_err());
        // told once: a later record of the same correlation goes to later waiters only
        let mut later = await_correlation("test-corr-x");
        correlation_recorded(Some("test-corr-x"), &b);
        assert_eq!(later.try_recv().unwrap(), b);
        // a waiter that gave up is dropped from the table
        drop(other);
        forget_correlation("test-corr-y");
        drop(early);
        forget_correlation("test-corr-early");
        let w = correlation_waiters();
        assert!(!w.contains_key("test-corr-y") && !w.contains_key("test-corr-early"));
    }
}
