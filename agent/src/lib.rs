//! The sluice agent: Kubernetes Services and EndpointSlices in, BPF maps
//! out. See `docs/architecture.md`.

pub mod admin;
pub mod cleanup;
pub mod cli;
pub mod conntrack;
pub mod datapath;
pub mod devices;
pub mod fast_hash;
pub mod few;
pub mod health;
pub mod healthcheck;
pub mod heap;
pub mod inspect;
pub mod manifests;
pub mod metrics;
pub mod model;
pub mod monitor;
pub mod netdev;
pub mod reconcile;
pub mod run;
pub mod sources;
pub mod stores;
pub mod sync;
pub mod translate;
