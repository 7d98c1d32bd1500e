//! Refused HTTP requests are cheap: each is counted (`/metrics`), and at most
//! [`PER_SOURCE_PER_MINUTE`] per source address per minute are recorded in the sessions journal
//! (an append, with its flush); the rest are only counted (`cairn_http_refused_unrecorded_total`).
//! A caller without a token can so not make the server write and flush once per request.
//!
//! The bookkeeping is bounded too: at most [`MAX_SOURCES`] addresses are remembered; past that,
//! windows that ended are forgotten first, and a refusal from an address that finds no room is
//! counted, not recorded.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals recorded in the journal per source address and minute.
pub const PER_SOURCE_PER_MINUTE: u32 = 10;

/// Source addresses remembered at once.
pub const MAX_SOURCES: usize = 4096;

const WINDOW: Duration = Duration::from_secs(60);

/// Which refusals are recorded, and how many were not.
#[derive(Default)]
pub struct Sampler {
    /// Per source: when its current window began, and how many it recorded in it.
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    unrecorded: AtomicU64,
}

impl Sampler {
    /// Whether a refusal from `source` at `now` is recorded in the journal; when not, it is
    /// counted as unrecorded.
    pub fn admit(&self, source: IpAddr, now: Instant) -> bool {
        let mut w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if !w.contains_key(&source) && w.len() >= MAX_SOURCES {
            w.retain(|_, (began, _)| now.saturating_duration_since(*began) < WINDOW);
        }
        let admitted = if w.len() < MAX_SOURCES || w.contains_key(&source) {
            let (began, n) = w.entry(source).or_insert((now, 0));
            if now.saturating_duration_since(*began) >= WINDOW {
                (*began, *n) = (now, 0);
            }
            *n += 1;
            *n <= PER_SOURCE_PER_MINUTE
        } else {
            false
        };
        if !admitted {
            self.unrecorded.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Refusals counted and not recorded so far.
    pub fn unrecorded(&self) -> u64 {
        self.unrecorded.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(n.to_be_bytes())
    }

    #[test]
    fn at_most_n_per_minute_per_source_are_recorded_the_rest_counted() {
        let s = Sampler::default();
        let t0 = Instant::now();
        let recorded = (0..1000).filter(|_| s.admit(ip(1), t0)).count();
        assert_eq!(recorded, PER_SOURCE_PER_MINUTE as usize);
        assert_eq!(s.unrecorded(), 1000 - u64::from(PER_SOURCE_PER_MINUTE));
        // another source has its own budget
        assert!(s.admit(ip(2), t0));
        // the next minute, the first source again
        assert!(!s.admit(ip(1), t0 + Duration::from_secs(59)));
        assert!(s.admit(ip(1), t0 + WINDOW));
    }

    #[test]
    fn the_sources_remembered_are_bounded() {
        let s = Sampler::default();
        let t0 = Instant::now();
        for n in 0..MAX_SOURCES as u32 {
            assert!(s.admit(ip(n), t0));
        }
        // full, all windows current: a new source is counted, not recorded
        assert!(!s.admit(ip(u32::MAX), t0));
        assert_eq!(s.windows.lock().unwrap().len(), MAX_SOURCES);
        // once the windows ended, room again
        assert!(s.admit(ip(u32::MAX), t0 + WINDOW));
        assert_eq!(s.windows.lock().unwrap().len(), 1);
    }
}
