//! The agent's Prometheus metrics (`/metrics`), all prefixed `sluice_`.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabel {
    pub map: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub last_sync: FloatGauge,
    pub first_sync: FloatGauge,
    pub frontends: Gauge,
    pub backends: Gauge,
    pub slots: Gauge,
    pub map_fill: Family<MapLabel, FloatGauge>,
    pub draining: Gauge,
    pub rejected: Family<ReasonLabel, Gauge>,
    pub manifest_problems: Family<ReasonLabel, Gauge>,
    pub refused: Family<ReasonLabel, Gauge>,
    pub maglev_fallback: Gauge,
    pub map_write_errors: Counter,
    pub map_writes: Counter,
    pub conntrack_entries: Gauge,
    pub conntrack_deleted: Counter,
    pub datapath: Family<ReasonLabel, Gauge>,
    pub devices: Gauge,
    pub xdp_devices: Family<ModeLabel, Gauge>,
    pub xdp_attach_failures: Counter,
    pub update_latency: Histogram,
    api_errors: Family<KindLabel, Counter>,
    relists: Family<KindLabel, Counter>,
    stale_events: Family<KindLabel, Counter>,
    duplicate_events: Family<KindLabel, Counter>,
}

/// The label of a kind of object, by its name (`Service`, ...).
fn kind(k: impl Into<&'static str>) -> KindLabel {
    KindLabel {
        kind: k.into().to_owned(),
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let m = Self {
            sync_duration: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 18),
            ),
            update_latency: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 18),
            ),
            last_sync: FloatGauge::default(),
            first_sync: FloatGauge::default(),
            frontends: Gauge::default(),
            backends: Gauge::default(),
            slots: Gauge::default(),
            map_fill: Family::default(),
            draining: Gauge::default(),
            rejected: Family::default(),
            manifest_problems: Family::default(),
            maglev_fallback: Gauge::default(),
            refused: Family::default(),
            map_write_errors: Counter::default(),
            map_writes: Counter::default(),
            conntrack_entries: Gauge::default(),
            conntrack_deleted: Counter::default(),
            datapath: Family::default(),
            devices: Gauge::default(),
            xdp_devices: Family::default(),
            xdp_attach_failures: Counter::default(),
            api_errors: Family::default(),
            relists: Family::default(),
            stale_events: Family::default(),
            duplicate_events: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "sync_duration_seconds",
            "Time to translate and program one change",
            m.sync_duration.clone(),
        );
        registry.register(
            "update_to_datapath_seconds",
            "Time from a source handing over an update to the maps holding it",
            m.update_latency.clone(),
        );
        registry.register(
            "last_sync_timestamp_seconds",
            "When the maps last equalled the desired state (Unix time)",
            m.last_sync.clone(),
        );
        registry.register(
            "first_sync_duration_seconds",
            "How long the first full sync after the start took (0 before it)",
            m.first_sync.clone(),
        );
        registry.register(
            "programmed_frontends",
            "Service frontends in the maps",
            m.frontends.clone(),
        );
        registry.register(
            "programmed_backends",
            "Backends in the maps",
            m.backends.clone(),
        );
        registry.register(
            "programmed_slots",
            "Backend slots in the maps",
            m.slots.clone(),
        );
        registry.register(
            "map_fill_ratio",
            "Entries over capacity, per map (each family under its own map: sl_svc4/sl_svc6, sl_maglev4/sl_maglev6, sl_ct4/sl_ct6, and sl_backends; sl_socktab: slots a balanced TCP socket holds, the rest go to sl_sock)",
            m.map_fill.clone(),
        );
        registry.register(
            "drain_queue",
            "Backends draining: no new flows, waiting for their flows to end",
            m.draining.clone(),
        );
        registry.register(
            "rejected_objects",
            "Objects or parts of objects left out, by reason",
            m.rejected.clone(),
        );
        registry.register(
            "manifest_problems",
            "Manifest files or documents of a dir: source not used (unparseable, over the size or nesting limits, duplicate definitions), by reason",
            m.manifest_problems.clone(),
        );
        registry.register(
            "maglev_fallback_service_ports",
            "Service ports that ask for Maglev but are balanced by flow hash: the Maglev table maps are full (--maglev-map-size)",
            m.maglev_fallback.clone(),
        );
        registry.register(
            "refused_service_ports",
            "Service ports not programmed, by reason",
            m.refused.clone(),
        );
        registry.register(
            "map_write_errors",
            "Failed map writes",
            m.map_write_errors.clone(),
        );
        registry.register(
            "map_writes",
            "Map updates and deletions issued (an unchanged desired state issues none)",
            m.map_writes.clone(),
        );
        registry.register(
            "conntrack_entries",
            "Entries in the conntrack map at the last scan",
            m.conntrack_entries.clone(),
        );
        registry.register(
            "conntrack_gc_deleted",
            "Conntrack entries deleted as expired or orphaned",
            m.conntrack_deleted.clone(),
        );
        registry.register(
            "datapath_events",
            "Datapath counters (sl_stats, summed over CPUs, since the maps were created)",
            m.datapath.clone(),
        );
        registry.register(
            "attached_devices",
            "Devices with sluice's programs attached",
            m.devices.clone(),
        );
        registry.register(
            "xdp_devices",
            "Devices running sl_xdp, by mode (native, generic; adopted: a pinned link taken over, mode as attached)",
            m.xdp_devices.clone(),
        );
        registry.register(
            "xdp_attach_failures",
            "XDP attaches refused (the device stays on TC only)",
            m.xdp_attach_failures.clone(),
        );
        registry.register(
            "api_errors",
            "Failed list/watch requests (each is followed by a reconnect with backoff)",
            m.api_errors.clone(),
        );
        registry.register(
            "relists",
            "Complete lists of a kind (start, 410 Gone, guard)",
            m.relists.clone(),
        );
        registry.register(
            "stale_events",
            "Watch events older than state already applied (answered with a relist)",
            m.stale_events.clone(),
        );
        registry.register(
            "duplicate_events",
            "Watch events repeating a version already applied",
            m.duplicate_events.clone(),
        );
        Self { registry, ..m }
    }

    pub fn api_errors(&self, k: impl Into<&'static str>) {
        self.api_errors.get_or_create(&kind(k)).inc();
    }

    pub fn relist(&self, k: impl Into<&'static str>) {
        self.relists.get_or_create(&kind(k)).inc();
    }

    pub fn stale_event(&self, k: impl Into<&'static str>) {
        self.stale_events.get_or_create(&kind(k)).inc();
    }

    pub fn duplicate_event(&self, k: impl Into<&'static str>) {
        self.duplicate_events.get_or_create(&kind(k)).inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
