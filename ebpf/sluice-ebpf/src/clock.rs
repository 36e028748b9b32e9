//! The datapath's clock for conntrack and affinity: `CLOCK_MONOTONIC` at
//! tick resolution (`bpf_ktime_get_coarse_ns`), the agent's timebase
//! (`conntrack::monotonic_ns`) at most a tick behind. Entries are refreshed
//! once a second and expire after seconds, so a tick is nothing to them,
//! while the precise clock (`bpf_ktime_get_ns`) reads the TSC through the
//! hypervisor's clock page on every packet. A stamp another writer took
//! with the precise clock may lie up to a tick ahead of `now()`: ages are
//! taken with `saturating_sub`, so such an entry counts as fresh.

/// Nanoseconds of `CLOCK_MONOTONIC`, to the tick.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: plain helper call.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_coarse_ns() }
}
