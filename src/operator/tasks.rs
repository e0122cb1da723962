//! The leader's long-running work (each Controller, each timer, provisioning, disruption), one
//! task each. Polled together in one task, anything slow in one (a provisioning round's
//! synchronous input, a garbage-collection pass over 1 000 instances) held up every other's
//! dispatch, and every wake-up of one polled all of them; spawned, the runtime spreads them
//! over its workers.
//!
//! The set keeps what joining them in one future gave: a panic in one stops the replica (named
//! here, where it would otherwise die silently with its task), and [`Tasks::stop`] aborts the
//! rest and waits until each has dropped its future (its `Leadership` receiver, its client);
//! `serve` calls it on every exit before it releases the Lease. Dropping the set aborts its
//! tasks without waiting. A scheduling solve handed to `spawn_blocking` runs to its end either
//! way; it writes nothing.

use std::collections::HashMap;
use std::future::Future;

use thiserror::Error;
use tokio::task::{Id, JoinSet};

/// A task of the set panicked.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("the {name} task panicked: {message}")]
pub struct Panicked {
    pub name: &'static str,
    pub message: String,
}

/// Why the wait on the set ended early.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TaskError {
    #[error(transparent)]
    Panicked(#[from] Panicked),
    /// A task whose work lasts as long as the replica leads ended (a Controller whose watch
    /// stream closed, say): the leader would go on holding the Lease without doing that work.
    #[error("the {0} task ended while its replica leads")]
    Ended(&'static str),
}

/// Named tasks that run until they end, one panics, or the set is stopped or dropped.
#[derive(Default)]
pub struct Tasks {
    running: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl Tasks {
    pub fn spawn(&mut self, name: &'static str, work: impl Future<Output = ()> + Send + 'static) {
        let id = self.running.spawn(work).id();
        self.names.insert(id, name);
    }

    /// Waits until every task has ended, or until one panics or ends while `shutting_down`
    /// says no: the others keep running then, until [`Tasks::stop`] or the set is dropped.
    pub async fn until_all_end(
        &mut self,
        shutting_down: impl Fn() -> bool,
    ) -> Result<(), TaskError> {
        while let Some(ended) = self.running.join_next_with_id().await {
            let error = match ended {
                Ok((id, ())) => {
                    let name = self.names.remove(&id).unwrap_or("unnamed");
                    if !shutting_down() {
                        return Err(TaskError::Ended(name));
                    }
                    continue;
                }
                Err(error) => error,
            };
            let name = self.names.remove(&error.id()).unwrap_or("unnamed");
            // Cancelled only by `stop`, which does not come through here.
            if error.is_panic() {
                return Err(TaskError::Panicked(Panicked {
                    name,
                    message: panic_message(error.into_panic()),
                }));
            }
        }
        Ok(())
    }

    /// Aborts the tasks still running and waits until each has ended.
    pub async fn stop(&mut self) {
        self.running.shutdown().await;
        self.names.clear();
    }
}

/// What `panic!` was given, when it was text.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(
            || "a panic without a message".into(),
            |text| text.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Sets its flag when dropped: shows a task's future is gone.
    struct DroppedFlag(Arc<AtomicBool>);

    impl Drop for DroppedFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn never_ending(flag: &Arc<AtomicBool>) -> impl Future<Output = ()> + Send + 'static {
        let guard = DroppedFlag(flag.clone());
        async move {
            let _guard = guard;
            std::future::pending::<()>().await
        }
    }

    #[tokio::test]
    async fn tasks_that_end_end_the_wait() {
        let mut tasks = Tasks::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tasks.spawn("first", async {});
        tasks.spawn("second", async move {
            let _ = rx.await;
        });
        tx.send(()).unwrap();
        assert_eq!(tasks.until_all_end(|| true).await, Ok(()));
        assert!(tasks.names.is_empty());
    }

    #[tokio::test]
    async fn a_task_that_ends_before_shutdown_is_named() {
        let mut tasks = Tasks::default();
        let other = Arc::new(AtomicBool::new(false));
        tasks.spawn("steady", never_ending(&other));
        tasks.spawn("watcher", async {});
        let shutting_down = AtomicBool::new(false);
        let ended = tasks
            .until_all_end(|| shutting_down.load(Ordering::SeqCst))
            .await;
        assert_eq!(ended, Err(TaskError::Ended("watcher")));
        assert!(
            ended
                .unwrap_err()
                .to_string()
                .contains("the watcher task ended"),
            "names it"
        );
        assert!(!other.load(Ordering::SeqCst), "the others keep running");
        // Once shutting down, an end is the graceful one.
        tasks.spawn("draining", async {});
        shutting_down.store(true, Ordering::SeqCst);
        tasks.stop().await;
        assert!(other.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_panic_names_its_task_and_stop_drops_the_others() {
        let mut tasks = Tasks::default();
        let other = Arc::new(AtomicBool::new(false));
        tasks.spawn("steady", never_ending(&other));
        tasks.spawn("faulty", async { panic!("injected fault {}", 7) });
        tasks.spawn("quiet", async { std::panic::panic_any(42_u8) });
        let panicked = |ended: Result<(), TaskError>| match ended {
            Err(TaskError::Panicked(panicked)) => panicked,
            other => panic!("a panic, not {other:?}"),
        };
        let first = panicked(tasks.until_all_end(|| false).await);
        let second = panicked(tasks.until_all_end(|| false).await);
        let mut seen = [first, second];
        seen.sort_by_key(|p| p.name);
        assert_eq!(
            seen,
            [
                Panicked {
                    name: "faulty",
                    message: "injected fault 7".into()
                },
                Panicked {
                    name: "quiet",
                    message: "a panic without a message".into()
                },
            ]
        );
        assert!(seen[0].to_string().contains("the faulty task panicked"));
        assert!(!other.load(Ordering::SeqCst), "a panic stops no other task");
        tasks.stop().await;
        assert!(
            other.load(Ordering::SeqCst),
            "stop waits until it is dropped"
        );
    }

    #[tokio::test]
    async fn dropping_the_set_aborts_its_tasks() {
        let flag = Arc::new(AtomicBool::new(false));
        let mut tasks = Tasks::default();
        tasks.spawn("steady", never_ending(&flag));
        drop(tasks);
        // The abort is asynchronous: the task's future is dropped on its worker.
        for _ in 0..1000 {
            if flag.load(Ordering::SeqCst) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the dropped set's task still holds its future");
    }
}
