//! Periodic work (instance GC, bootstrap-token cleanup, NodeOverlay status) under the same
//! discipline as the reconcilers: each pass is timed into
//! `karpenter_exoscale_periodic_duration_seconds{controller}`, a failed pass is counted in
//! `karpenter_exoscale_reconcile_errors_total{controller,error}` and logged, and the next pass
//! comes after `interval` whatever happened (a pass never retries in a tight loop).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::operator::metrics::labels;

use super::{Context, Error};

/// Runs one pass and records it; returns the pass's outcome for callers that act on it.
pub async fn pass<T, F>(ctx: &Context, controller: &'static str, work: F) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    let started = Instant::now();
    let result = work.await;
    ctx.metrics
        .periodic_duration
        .get_or_create(&labels([("controller", controller)]))
        .observe(started.elapsed().as_secs_f64());
    if let Err(error) = &result {
        let label = error.metric_label();
        ctx.metrics
            .reconcile_errors
            .get_or_create(&labels([("controller", controller), ("error", &label)]))
            .inc();
        tracing::warn!(controller, %error, "periodic pass failed");
    }
    result
}

/// Runs `work` until the returned future is dropped; each pass says when the next is due
/// (after a failed pass: `interval`).
pub async fn paced<F, Fut>(
    ctx: Arc<Context>,
    controller: &'static str,
    interval: Duration,
    mut work: F,
) where
    F: FnMut(Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Duration, Error>>,
{
    loop {
        let next = pass(&ctx, controller, work(ctx.clone())).await;
        tokio::time::sleep(next.unwrap_or(interval)).await;
    }
}

/// Runs `work` every `interval` until the returned future is dropped.
pub async fn every<T, F, Fut>(
    ctx: Arc<Context>,
    controller: &'static str,
    interval: Duration,
    mut work: F,
) where
    F: FnMut(Arc<Context>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let fixed = move |ctx| {
        let pass = work(ctx);
        async move { pass.await.map(|_| interval) }
    };
    paced(ctx, controller, interval, fixed).await
}
