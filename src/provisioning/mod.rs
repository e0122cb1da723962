//! Provisioning: batches pending pods, solves them with the shared scheduler against existing
//! capacity and NodePool templates, and creates NodeClaims.

pub mod backoff;
pub mod batcher;
pub mod controller;
pub mod displacement;
pub mod effective_zone;
pub mod eligibility;
pub mod input;
pub mod template;
pub mod volumes;

use std::sync::Arc;

use crate::controllers::ExtraController;
use crate::operator::config::Config;

/// Provisioning settings from the operator configuration.
pub fn settings(config: &Config) -> controller::Settings {
    controller::Settings {
        batch_idle: config.batch_idle_duration,
        batch_max: config.batch_max_duration,
        preference_policy: config.preference_policy,
        min_values_policy: config.min_values_policy,
        default_topology_spread: config.default_topology_spread.clone(),
        ignore_dra_requests: config.ignore_dra_requests,
        requeue_after: controller::REQUEUE_AFTER,
    }
}

/// The provisioning controller as an operator plug-in (started on the leader). `nominations`
/// is shared with disruption, which leaves recently nominated nodes alone.
pub fn plugin(
    settings: controller::Settings,
    nominations: Arc<controller::Nominations>,
) -> ExtraController {
    ExtraController {
        name: "provisioner",
        start: Box::new(move |ctx, shutdown| {
            Box::pin(async move {
                let provisioner = controller::Provisioner::new(ctx, settings, nominations);
                provisioner.run(shutdown).await;
            })
        }),
    }
}
