//! NodeClaim creates whose answer never came. NodeClaims are created with generated names, so
//! one the API server committed without answering cannot be looked up: whatever creates them
//! (provisioning, disruption's replacements, static NodePools) decides again only once cluster
//! state holds every NodeClaim the API server lists; deciding before the watch brings it would
//! launch its pods a second NodeClaim, and a second VM.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;

use crate::apis::NodeClaim;
use crate::state::Cluster;

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
    unconfirmed: AtomicBool,
}

impl LostCreates {
    /// Notes a failed NodeClaim create; one whose outcome is unknown holds decisions back.
    pub fn failed(&self, error: &kube::Error) {
        if create_outcome_unknown(error) {
            self.unconfirmed.store(true, SeqCst);
        }
    }

    /// True when no create's outcome is unknown, or once cluster state holds every NodeClaim
    /// the API server lists (a consistent read of their metadata), checked up to `checks`
    /// times a second apart.
    pub async fn caught_up(&self, client: &kube::Client, cluster: &Cluster, checks: usize) -> bool {
        if !self.unconfirmed.load(SeqCst) {
            return true;
        }
        let api: Api<NodeClaim> = Api::all(client.clone());
        for check in 0..checks {
            if check > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
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
            if missing == 0 {
                self.unconfirmed.store(false, SeqCst);
                return true;
            }
            tracing::info!(
                missing,
                "waiting for cluster state to hold the NodeClaims a create whose answer was lost may have made"
            );
        }
        false
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
}
