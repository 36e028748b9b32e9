//! The flow hash lives in `sluice_common::hash` so that the agent and the
//! tests compute exactly what the datapath does.

use sluice_common::hash::flow_hash_v4;

use crate::flow::Flow4;

#[inline(always)]
pub fn flow(flow: &Flow4, seed: u32) -> u32 {
    flow_hash_v4(flow.src, flow.dst, flow.sport, flow.dport, flow.proto, seed)
}
