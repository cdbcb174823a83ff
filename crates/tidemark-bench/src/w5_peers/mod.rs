//! W5 on the peers: the same live-latency, catch-up and idle-subscription steps as
//! [`crate::w5`] runs on Tidemark, each through the peer's own consumer API.

mod driver;
pub mod kafka;
pub mod nats;
pub mod redis;
