//! The sluice agent: Kubernetes Services and EndpointSlices in, BPF maps
//! out. See `docs/architecture.md`.

pub mod conntrack;
pub mod datapath;
pub mod manifests;
pub mod model;
pub mod reconcile;
pub mod state;
pub mod translate;
