//! NodeClaim creates whose answer never came. NodeClaims are created with generated names, so
//! one the API server committed without answering cannot be looked up: whatever creates them
//! (provisioning, disruption's replacements, static NodePools) decides again only once cluster
//! state holds every NodeClaim the API server lists; deciding before the watch brings it would
//! launch its pods a second NodeClaim, and a second VM. A create given up by the client may be
//! committed by the API server up to its request timeout later, so the list that settles it
//! must begin after that ([`SERVER_MAY_COMMIT_FOR`]).

use std::sync::Mutex;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use tokio::time::Instant;

use crate::apis::NodeClaim;
use crate::state::Cluster;

/// How long the API server may still commit a create after its client stopped waiting for the
/// answer: kube-apiserver's default `--request-timeout` (60 s), and a margin. A create given up
/// at the Lease's renew deadline (~10 s) can be committed well after that, so only a list begun
/// once this has passed can show that it was not.
pub const SERVER_MAY_COMMIT_FOR: Duration = Duration::from_secs(65);

/// Whether a failed create may still have created its object: no answer at all, or a server
/// error (a timeout answered after the write may have been committed). A refusal (4xx) and
/// our own fence's refusal left nothing.
pub fn create_outcome_unknown(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500,
        other => !crate::operator::fenced_client::is_fenced(other),
    }
}

/// Shared by every NodeClaim creator of a replica.
#[derive(Debug, Default)]
pub struct LostCreates {
    state: Mutex<Unconfirmed>,
}

impl LostCreates {
    fn state(&self) -> std::sync::MutexGuard<'_, Unconfirmed> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes a failed NodeClaim create; one whose outcome is unknown holds decisions back.
    pub fn failed(&self, error: &kube::Error) {
        if create_outcome_unknown(error) {
            tracing::warn!(%error, wait_secs = SERVER_MAY_COMMIT_FOR.as_secs(), "a NodeClaim create's outcome is unknown; no NodeClaim is created until the API server can no longer be committing it and cluster state holds every NodeClaim");
            self.state().failed(Instant::now());
        }
    }

    /// True when no create's outcome is unknown, or once cluster state holds every NodeClaim
    /// the API server lists (a consistent read of their metadata) in a list begun when the
    /// server can no longer be committing one, checked up to `checks` times a second apart.
    pub async fn caught_up(&self, client: &kube::Client, cluster: &Cluster, checks: usize) -> bool {
        let api: Api<NodeClaim> = Api::all(client.clone());
        for check in 0..checks {
            if check > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let covering = match self.state().check(Instant::now()) {
                Check::Clear => return true,
                Check::WaitUntil(at) => {
                    let secs = at.saturating_duration_since(Instant::now()).as_secs();
                    tracing::debug!(
                        in_secs = secs,
                        "a NodeClaim create whose outcome is unknown may still be committed by the API server; not deciding before it cannot be"
                    );
                    return false;
                }
                Check::List { covering } => covering,
            };
            let listed = match api.list_metadata(&Default::default()).await {
                Ok(listed) => listed,
                Err(error) => {
                    tracing::warn!(%error, "cannot list NodeClaims after a create whose answer was lost");
                    continue;
                }
            };
            let index = cluster.read();
            let missing = listed
                .items
                .iter()
                .filter(|c| index.nodeclaim(&c.name_any()).is_none())
                .count();
            drop(index);
            if missing == 0 {
                let mut state = self.state();
                state.settled(covering);
                // Another creator's create may have failed while this list was under way.
                return matches!(state.check(Instant::now()), Check::Clear);
            }
            tracing::info!(
                missing,
                "waiting for cluster state to hold the NodeClaims a create whose answer was lost may have made"
            );
        }
        false
    }
}

/// Creates whose outcome is unknown, and which of them a list has settled; pure, time passed in.
#[derive(Debug, Default)]
struct Unconfirmed {
    /// Failures with an unknown outcome so far.
    failures: u64,
    /// Failures that a list begun after them has settled.
    settled: u64,
    /// A list begun before this may miss a create the server is still committing.
    list_after: Option<Instant>,
}

#[derive(Debug, PartialEq, Eq)]
enum Check {
    /// No create's outcome is unknown.
    Clear,
    /// A list now could miss a create still being committed: not before this instant.
    WaitUntil(Instant),
    /// A list begun now settles the first `covering` failures if it shows nothing missing.
    List { covering: u64 },
}

impl Unconfirmed {
    fn failed(&mut self, now: Instant) {
        self.failures += 1;
        let after = now + SERVER_MAY_COMMIT_FOR;
        self.list_after = Some(self.list_after.map_or(after, |a| a.max(after)));
    }

    fn check(&self, now: Instant) -> Check {
        if self.settled >= self.failures {
            return Check::Clear;
        }
        match self.list_after {
            Some(after) if now < after => Check::WaitUntil(after),
            _ => Check::List {
                covering: self.failures,
            },
        }
    }

    fn settled(&mut self, covering: u64) {
        self.settled = self.settled.max(covering);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("injected", "Test")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn refusals_leave_nothing_and_the_rest_may_have_created() {
        assert!(!create_outcome_unknown(&api_error(409)));
        assert!(!create_outcome_unknown(&api_error(422)));
        assert!(!create_outcome_unknown(&api_error(429)));
        assert!(create_outcome_unknown(&api_error(500)));
        assert!(create_outcome_unknown(&api_error(504)));
        let fenced = kube::Error::Service(Box::new(crate::fence::Fenced {
            what: "POST nodeclaims".into(),
        }));
        assert!(!create_outcome_unknown(&fenced));
        let reset = kube::Error::Service("connection reset by peer".into());
        assert!(create_outcome_unknown(&reset));
    }

    #[test]
    fn a_lost_create_is_settled_only_by_a_list_begun_once_the_server_cannot_commit_it() {
        let t0 = Instant::now();
        let mut state = Unconfirmed::default();
        assert_eq!(state.check(t0), Check::Clear);
        state.failed(t0);
        // A list begun 10 s later could miss the create the server commits at 12 s.
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(state.check(at(10)), Check::WaitUntil(at(65)));
        let Check::List { covering } = state.check(at(65)) else {
            panic!("a list may settle it after the server's request timeout");
        };
        state.settled(covering);
        assert_eq!(state.check(at(66)), Check::Clear);
    }

    #[test]
    fn a_list_does_not_settle_a_create_that_failed_while_it_was_under_way() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let mut state = Unconfirmed::default();
        state.failed(t0);
        let Check::List { covering } = state.check(at(70)) else {
            panic!("listable");
        };
        // Another creator's create fails while the list runs.
        state.failed(at(71));
        state.settled(covering);
        assert_eq!(state.check(at(72)), Check::WaitUntil(at(71 + 65)));
        let Check::List { covering } = state.check(at(140)) else {
            panic!("listable");
        };
        state.settled(covering);
        assert_eq!(state.check(at(140)), Check::Clear);
    }
}
