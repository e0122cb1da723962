//! The error kinds of the CloudProvider contract. The core reacts differently to each, exactly
//! as upstream Karpenter does (karpenter-core.md §2.2).

use thiserror::Error;

/// Errors returned by every [`super::CloudProvider`] method.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CloudProviderError {
    /// No capacity for the requested offerings: the core deletes the NodeClaim and re-simulates
    /// with the offering marked unavailable.
    #[error("insufficient capacity: {message}")]
    InsufficientCapacity {
        message: String,
        /// Offerings (instance-type name, zone) found exhausted, so callers can mark them.
        offerings: Vec<(String, String)>,
    },
    /// The instance behind a NodeClaim does not exist (any more).
    #[error("nodeclaim not found: {0}")]
    NodeClaimNotFound(String),
    /// The NodeClass is not ready (its resolution failed); the NodeClaim is deleted.
    #[error("nodeclass not ready: {0}")]
    NodeClassNotReady(String),
    /// Any other launch failure: the core sets Launched=Unknown with this reason and retries.
    #[error("{reason}: {message}")]
    Create { reason: String, message: String },
    /// A failure outside `create` (API unreachable, bad configuration, ...).
    #[error("{0}")]
    Other(String),
}

impl CloudProviderError {
    pub fn insufficient_capacity(message: impl Into<String>) -> Self {
        CloudProviderError::InsufficientCapacity {
            message: message.into(),
            offerings: Vec::new(),
        }
    }

    pub fn create(reason: &str, message: impl Into<String>) -> Self {
        CloudProviderError::Create {
            reason: reason.to_string(),
            message: message.into(),
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, CloudProviderError::NodeClaimNotFound(_))
    }

    pub fn is_insufficient_capacity(&self) -> bool {
        matches!(self, CloudProviderError::InsufficientCapacity { .. })
    }

    pub fn is_nodeclass_not_ready(&self) -> bool {
        matches!(self, CloudProviderError::NodeClassNotReady(_))
    }

    /// A short stable label for metrics and events.
    pub fn kind(&self) -> &'static str {
        match self {
            CloudProviderError::InsufficientCapacity { .. } => "insufficient_capacity",
            CloudProviderError::NodeClaimNotFound(_) => "nodeclaim_not_found",
            CloudProviderError::NodeClassNotReady(_) => "nodeclass_not_ready",
            CloudProviderError::Create { .. } => "create",
            CloudProviderError::Other(_) => "other",
        }
    }
}

/// Condition reasons the Exoscale provider uses in [`CloudProviderError::Create`].
pub mod reasons {
    pub const BOOTSTRAP_TOKEN_CREATION_FAILED: &str = "BootstrapTokenCreationFailed";
    pub const USER_DATA_GENERATION_FAILED: &str = "UserDataGenerationFailed";
    pub const TEMPLATE_RESOLUTION_FAILED: &str = "TemplateResolutionFailed";
    pub const INSTANCE_CREATION_FAILED: &str = "InstanceCreationFailed";
    pub const PRIVATE_NETWORK_ATTACH_FAILED: &str = "PrivateNetworkAttachFailed";
    pub const INSTANCE_TYPE_SELECTION_FAILED: &str = "InstanceTypeSelectionFailed";
    pub const NODECLASS_RESOLUTION_FAILED: &str = "NodeClassResolutionFailed";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_messages_name_the_problem() {
        let e = CloudProviderError::create("InstanceCreationFailed", "boom");
        assert_eq!(e.to_string(), "InstanceCreationFailed: boom");
        assert_eq!(e.kind(), "create");
        assert!(CloudProviderError::insufficient_capacity("x").is_insufficient_capacity());
        assert!(CloudProviderError::NodeClaimNotFound("i".into()).is_not_found());
        assert!(CloudProviderError::NodeClassNotReady("n".into()).is_nodeclass_not_ready());
    }
}
