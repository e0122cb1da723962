//! Hand-written client for the Exoscale public API v2.
//!
//! Pure pieces (`signer`, `retry`, `poll`, `ratelimit`'s bucket, `endpoint`) are separate from
//! the I/O in `client`, so they are unit-tested with fixed clocks and vectors.

pub mod client;
pub mod credentials;
pub mod endpoint;
pub mod error;
pub mod models;
pub mod poll;
pub mod ratelimit;
pub mod retry;
pub mod signer;

pub use client::{
    Client, ClientConfig, CreatedInstance, InstanceFilter, Observer, RequestObserver,
    operation_name,
};
pub use credentials::{ApiSecret, Credentials};
pub use endpoint::{Endpoint, EndpointError};
pub use error::Error;
pub use poll::PollPolicy;
pub use ratelimit::RateLimit;
pub use retry::RetryPolicy;
pub use signer::{Clock, FixedClock, SystemClock};
