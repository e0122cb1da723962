//! Leader election on a `coordination.k8s.io/v1` Lease, with fencing.
//!
//! The Lease is read, then taken or renewed by an update carrying the read `resourceVersion`
//! (optimistic concurrency, as client-go's leader election), so two replicas can never both
//! believe a write of theirs won. Leadership ends at the **renew deadline**: the start of the
//! last successful renewal plus `renew_deadline`, enforced at call time by the shared [`Fence`]
//! — a leader cut off from the API server stops writing then, whether or not it can tell why.
//! A standby takes the Lease only after it has seen the Lease unchanged for its full
//! `leaseDurationSeconds`, which is longer than the renew deadline.
//!
//! This replaces `kube-lease-manager`, which reports a loss only when it sees another holder:
//! a partitioned leader never saw one and kept acting.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use thiserror::Error;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::fence::Fence;

#[derive(Debug, Error)]
pub enum LeaderError {
    #[error(
        "invalid Lease timings: need retry period < renew deadline < lease duration, got {retry_period:?} / {renew_deadline:?} / {duration:?}"
    )]
    Timings {
        duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    },
}

/// A view of whether this replica leads. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    fence: Fence,
}

impl Leadership {
    /// Always leading (`DISABLE_LEADER_ELECTION=true`, tests). Keeps its sender alive forever.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        // The sender must outlive every receiver or `changed()` reports closure.
        std::mem::forget(tx);
        Leadership {
            rx,
            fence: Fence::open(),
        }
    }

    /// A handle driven by the given channel (tests flip it by hand).
    pub fn from_channel(rx: watch::Receiver<bool>) -> Self {
        Leadership {
            rx,
            fence: Fence::open(),
        }
    }

    /// Leading, and still before the renew deadline (checked now, not when last renewed).
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow() && self.fence.allows()
    }

    /// The fence every mutating call checks.
    pub fn fence(&self) -> &Fence {
        &self.fence
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

/// Lease timings; the defaults are client-go's (15 s lease, 10 s renew deadline, 2 s retry).
#[derive(Clone, Copy, Debug)]
pub struct LeaseTimings {
    /// `leaseDurationSeconds`: how long a standby waits, after the Lease last changed, before
    /// taking it.
    pub duration: Duration,
    /// How long after the start of its last successful renewal the leader stops writing.
    pub renew_deadline: Duration,
    /// Pause between attempts to take or renew.
    pub retry_period: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        LeaseTimings {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaseTimings {
    fn validate(self) -> Result<Self, LeaderError> {
        let ok = self.retry_period < self.renew_deadline
            && self.renew_deadline < self.duration
            && self.duration >= Duration::from_secs(1);
        if ok {
            Ok(self)
        } else {
            Err(LeaderError::Timings {
                duration: self.duration,
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            })
        }
    }
}

/// The Lease as last read, and when (local monotonic time) it last changed.
#[derive(Debug, Clone)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<String>,
    resource_version: Option<String>,
    changed_at: Instant,
}

/// What to do after reading the Lease.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// No Lease yet: create it, holding it.
    Create,
    /// Ours: renew it.
    Renew,
    /// Unheld or expired: take it over.
    TakeOver,
    /// Someone else holds it and it has not expired.
    Wait,
}

/// Pure decision over one read. Expiry is judged by when *we* saw the Lease last change, never
/// by the holder's timestamps (clocks differ across machines).
fn decide(
    identity: &str,
    lease: Option<&Lease>,
    previous: Option<&Observed>,
    now: Instant,
    default_duration: Duration,
) -> (Step, Option<Observed>) {
    let Some(lease) = lease else {
        return (Step::Create, None);
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let renew_time = spec.renew_time.map(|t| t.0.to_string());
    let resource_version = lease.metadata.resource_version.clone();
    let duration = spec
        .lease_duration_seconds
        .filter(|s| *s > 0)
        .map_or(default_duration, |s| Duration::from_secs(s as u64));
    let unchanged = previous.is_some_and(|p| {
        p.holder == holder && p.renew_time == renew_time && p.resource_version == resource_version
    });
    let changed_at = match previous {
        Some(p) if unchanged => p.changed_at,
        _ => now,
    };
    let observed = Observed {
        holder: holder.clone(),
        renew_time,
        resource_version,
        changed_at,
    };
    let step = match holder.as_deref() {
        Some(h) if h == identity => Step::Renew,
        None => Step::TakeOver,
        Some(_) if now >= changed_at + duration => Step::TakeOver,
        Some(_) => Step::Wait,
    };
    (step, Some(observed))
}

/// A running election; [`Election::release`] gives the Lease up.
pub struct Election {
    pub leadership: Leadership,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Starts competing for the Lease `namespace/name` as `identity`, driving `fence`.
pub async fn elect(
    client: kube::Client,
    namespace: &str,
    name: &str,
    identity: &str,
    timings: LeaseTimings,
    fence: Fence,
) -> Result<Election, LeaderError> {
    let timings = timings.validate()?;
    let (tx, rx) = watch::channel(false);
    let (stop_tx, stop_rx) = oneshot::channel();
    let elector = Elector {
        client,
        namespace: namespace.to_string(),
        name: name.to_string(),
        identity: identity.to_string(),
        timings,
        fence: fence.clone(),
        leading: tx,
        observed: None,
    };
    let task = tokio::spawn(elector.run(stop_rx));
    Ok(Election {
        leadership: Leadership { rx, fence },
        stop: Some(stop_tx),
        task,
    })
}

impl Election {
    /// Gives the Lease up so another replica takes over at once, not after it expires.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(Duration::from_secs(5), &mut self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "leader election task failed"),
            Err(_) => {
                self.task.abort();
                tracing::warn!("timed out releasing the leader Lease");
            }
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // Without release (a crash-like drop): stop renewing; the Lease expires on its own.
        self.task.abort();
    }
}

struct Elector {
    client: kube::Client,
    namespace: String,
    name: String,
    identity: String,
    timings: LeaseTimings,
    fence: Fence,
    leading: watch::Sender<bool>,
    observed: Option<Observed>,
}

/// The outcome of one attempt.
enum Attempt {
    /// We hold the Lease, renewed by a write that started at this instant.
    Held(Instant),
    /// Someone else holds it (or won the race for it).
    Other,
}

impl Elector {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        loop {
            let started = Instant::now();
            // Armed only while leading: a stale deadline must not spin a standby.
            let deadline = if *self.leading.borrow() {
                self.fence.deadline()
            } else {
                None
            };
            let attempt = tokio::time::timeout(self.timings.renew_deadline, self.attempt());
            tokio::select! {
                _ = &mut stop => break,
                // Stand down at the deadline even while an attempt hangs.
                _ = sleep_until_opt(deadline) => {
                    self.stand_down("the renew deadline passed without a successful renewal");
                    continue;
                }
                result = attempt => match result {
                    Ok(Ok(Attempt::Held(at))) => {
                        self.fence.extend_until(at + self.timings.renew_deadline);
                        if !*self.leading.borrow() {
                            tracing::info!(identity = %self.identity, lease = %self.name, "acquired the leader Lease");
                            let _ = self.leading.send(true);
                        }
                    }
                    Ok(Ok(Attempt::Other)) => {
                        if *self.leading.borrow() {
                            self.fence.close();
                            self.stand_down("another replica holds the Lease");
                        }
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(%error, lease = %self.name, "cannot read or renew the leader Lease");
                        self.stand_down_if_past_deadline();
                    }
                    Err(_) => {
                        tracing::warn!(lease = %self.name, "leader Lease request timed out");
                        self.stand_down_if_past_deadline();
                    }
                },
            }
            let next = started + self.timings.retry_period;
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
        }
        self.release().await;
    }

    fn stand_down_if_past_deadline(&self) {
        if *self.leading.borrow() && !self.fence.allows() {
            self.stand_down("the renew deadline passed without a successful renewal");
        }
    }

    fn stand_down(&self, why: &str) {
        if *self.leading.borrow() {
            tracing::error!(identity = %self.identity, lease = %self.name, why, "lost leadership; writes are fenced");
            let _ = self.leading.send(false);
        }
    }

    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let lease = leases.get_opt(&self.name).await?;
        let now = Instant::now();
        let (step, observed) = decide(
            &self.identity,
            lease.as_ref(),
            self.observed.as_ref(),
            now,
            self.timings.duration,
        );
        self.observed = observed;
        match step {
            Step::Wait => Ok(Attempt::Other),
            Step::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(None)),
                };
                match leases.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(Attempt::Held(now)),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Other),
                    Err(e) => Err(e),
                }
            }
            Step::Renew | Step::TakeOver => {
                // `decide` answers Renew or TakeOver only for a Lease it read.
                let Some(mut lease) = lease else {
                    return Ok(Attempt::Other);
                };
                lease.spec = Some(self.spec(lease.spec.take()));
                match leases
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(Attempt::Held(now)),
                    // Someone wrote in between: re-read next round.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Other),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// The spec that says we hold the Lease now; `previous` keeps acquire time and
    /// transitions when we already held it.
    fn spec(&self, previous: Option<LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let previous = previous.unwrap_or_default();
        let ours = previous.holder_identity.as_deref() == Some(self.identity.as_str());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timings.duration.as_secs().max(1) as i32),
            acquire_time: if ours {
                previous.acquire_time.or_else(|| Some(now.clone()))
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(
                previous.lease_transitions.unwrap_or(0) + if ours { 0 } else { 1 },
            ),
            ..previous
        }
    }

    /// Stops writing, then clears the holder so a standby takes over at once.
    async fn release(self) {
        let held = self.fence.allows();
        self.fence.close();
        let _ = self.leading.send(false);
        if !held {
            return;
        }
        let result = async {
            let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
            let Some(mut lease) = leases.get_opt(&self.name).await? else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            leases
                .replace(&self.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        };
        match tokio::time::timeout(self.timings.retry_period, result).await {
            Ok(Ok(())) => tracing::info!("released the leader Lease"),
            Ok(Err(error)) => tracing::warn!(%error, "cannot release the leader Lease"),
            Err(_) => tracing::warn!("timed out releasing the leader Lease"),
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, rv: &str, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("l".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                lease_duration_seconds: Some(duration),
                ..Default::default()
            }),
        }
    }

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

    #[test]
    fn leadership_ends_at_the_fence_deadline_without_any_notification() {
        let (_tx, rx) = watch::channel(true);
        let fence = Fence::closed();
        let leadership = Leadership {
            rx,
            fence: fence.clone(),
        };
        assert!(!leadership.is_leader(), "never renewed");
        fence.extend_until(Instant::now() + Duration::from_secs(60));
        assert!(leadership.is_leader());
        fence.extend_until(Instant::now() - Duration::from_secs(1));
        assert!(leadership.is_leader(), "the deadline never moves back");
        fence.close();
        assert!(!leadership.is_leader());
    }

    #[test]
    fn a_missing_lease_is_created_and_an_unheld_one_taken() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        assert_eq!(decide("me", None, None, t0, d).0, Step::Create);
        assert_eq!(
            decide("me", Some(&lease(None, "1", 15)), None, t0, d).0,
            Step::TakeOver
        );
        assert_eq!(
            decide("me", Some(&lease(Some(""), "1", 15)), None, t0, d).0,
            Step::TakeOver
        );
        assert_eq!(
            decide("me", Some(&lease(Some("me"), "1", 15)), None, t0, d).0,
            Step::Renew
        );
    }

    #[test]
    fn another_holder_is_waited_for_a_full_duration_after_the_last_change_we_saw() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        let held = lease(Some("other"), "1", 15);
        let (step, seen) = decide("me", Some(&held), None, t0, d);
        assert_eq!(step, Step::Wait);
        let s = Duration::from_secs;
        let (step, seen) = decide("me", Some(&held), seen.as_ref(), t0 + s(14), d);
        assert_eq!(step, Step::Wait);
        // A renewal (new resourceVersion) restarts the wait.
        let renewed = lease(Some("other"), "2", 15);
        let (step, seen) = decide("me", Some(&renewed), seen.as_ref(), t0 + s(14), d);
        assert_eq!(step, Step::Wait);
        let (step, seen) = decide("me", Some(&renewed), seen.as_ref(), t0 + s(28), d);
        assert_eq!(step, Step::Wait);
        let (step, _) = decide("me", Some(&renewed), seen.as_ref(), t0 + s(29), d);
        assert_eq!(step, Step::TakeOver);
    }

    #[test]
    fn the_holders_own_duration_is_honoured() {
        let t0 = Instant::now();
        let held = lease(Some("other"), "1", 60);
        let (_, seen) = decide("me", Some(&held), None, t0, Duration::from_secs(15));
        let (step, _) = decide(
            "me",
            Some(&held),
            seen.as_ref(),
            t0 + Duration::from_secs(30),
            Duration::from_secs(15),
        );
        assert_eq!(step, Step::Wait);
    }

    #[test]
    fn timings_must_leave_the_standby_longer_than_the_renew_deadline() {
        let s = Duration::from_secs;
        assert!(LeaseTimings::default().validate().is_ok());
        let bad = LeaseTimings {
            duration: s(10),
            renew_deadline: s(10),
            retry_period: s(2),
        };
        assert!(bad.validate().is_err());
        let bad = LeaseTimings {
            duration: s(15),
            renew_deadline: s(2),
            retry_period: s(2),
        };
        assert!(bad.validate().is_err());
    }
}
