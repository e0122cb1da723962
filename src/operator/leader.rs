//! Leader election on a `coordination.k8s.io/v1` Lease. Only the leader runs controllers that
//! write; like upstream (controller-runtime), a replica that loses the Lease shuts down and is
//! restarted by its Deployment, so no controller ever keeps acting on a stale belief.

use std::time::Duration;

use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Error)]
pub enum LeaderError {
    #[error("cannot set up leader election on Lease {namespace}/{name}: {source}")]
    Setup {
        namespace: String,
        name: String,
        #[source]
        source: LeaseManagerError,
    },
}

/// A view of whether this replica leads. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
}

impl Leadership {
    /// Always leading (`DISABLE_LEADER_ELECTION=true`, tests). Keeps its sender alive forever.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        // The sender must outlive every receiver or `changed()` reports closure.
        std::mem::forget(tx);
        Leadership { rx }
    }

    /// A handle driven by the given channel (tests flip it by hand).
    pub fn from_channel(rx: watch::Receiver<bool>) -> Self {
        Leadership { rx }
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once this replica leads.
    pub async fn acquired(&mut self) {
        // An Err means the election task ended; we then never lead.
        if self.rx.wait_for(|leading| *leading).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when leadership is lost (or the election task ended).
    pub async fn lost(&mut self) {
        let _ = self.rx.wait_for(|leading| !*leading).await;
    }
}

/// A running election; dropping every [`Leadership`] handle and this releases the Lease.
pub struct Election {
    pub leadership: Leadership,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

/// Lease timings (controller-runtime defaults: 15 s lease, renewed 5 s before expiry).
#[derive(Clone, Copy, Debug)]
pub struct LeaseTimings {
    pub duration: Duration,
    pub grace: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        LeaseTimings {
            duration: Duration::from_secs(15),
            grace: Duration::from_secs(5),
        }
    }
}

/// Starts competing for the Lease `namespace/name` as `identity`.
pub async fn elect(
    client: kube::Client,
    namespace: &str,
    name: &str,
    identity: &str,
    timings: LeaseTimings,
) -> Result<Election, LeaderError> {
    let manager = LeaseManagerBuilder::new(client, name)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(timings.duration.as_secs().max(2))
        .with_grace(timings.grace.as_secs().max(1))
        // One field manager per replica: taking an unheld Lease is a server-side apply of
        // `holderIdentity`, and only distinct managers make a simultaneous second claim a
        // conflict instead of a silent overwrite that leaves two replicas leading.
        .with_field_manager(format!("karpenter-exoscale/{identity}"))
        .build()
        .await
        .map_err(|source| LeaderError::Setup {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })?;
    let (rx, task) = manager.watch().await;
    Ok(Election {
        leadership: Leadership { rx },
        task,
    })
}

impl Election {
    /// Gives the Lease up so another replica takes over at once, not after it expires.
    pub async fn release(self) {
        let Election { leadership, task } = self;
        drop(leadership);
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("released the leader Lease"),
            Ok(Ok(Err(error))) => tracing::warn!(%error, "cannot release the leader Lease"),
            Ok(Err(error)) => tracing::warn!(%error, "leader election task failed"),
            Err(_) => tracing::warn!("timed out releasing the leader Lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn channel_driven_leadership_reports_transitions() {
        let (tx, rx) = watch::channel(false);
        let mut leadership = Leadership::from_channel(rx);
        assert!(!leadership.is_leader());
        tx.send(true).unwrap();
        leadership.acquired().await;
        assert!(leadership.is_leader());
        tx.send(false).unwrap();
        leadership.lost().await;
        assert!(!leadership.is_leader());
        assert!(Leadership::always().is_leader());
    }
}
