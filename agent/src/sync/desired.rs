//! What the translation of the services gave, kept up to date service by
//! service for the sync task: no service port's desired state beyond the
//! reconcile at hand.

use std::collections::{BTreeMap, BTreeSet};

use crate::fast_hash::HashMap;

use super::ports::PortsByService;
use crate::{
    datapath::MapWrites,
    few::Few,
    healthcheck::HealthChecks,
    model::{DesiredState, ServicePortName},
    reconcile::Reconciler,
    stores::{Dirty, Stores},
    translate::{
        service_cluster_ips, translate_service, wanted_service_cidrs, HealthCheck, NodeContext,
        ObjectKey, Problem, TranslateConfig,
    },
};

/// What the translation of the services gave, kept up to date service by
/// service. The service ports' own desired state is not kept: it is
/// translated from the stores for the reconcile that needs it
/// (`state.services` holds only that reconcile's services) and dropped
/// after it, so the agent holds one copy of every service (the stores)
/// and the record of what is programmed, not a third.
#[derive(Default)]
pub(super) struct Desired {
    /// The cluster-wide part of the desired state, and the service ports
    /// of the reconcile at hand.
    pub(super) state: DesiredState,
    /// Services translated into `state.services` for the reconcile at hand.
    pub(super) translated: BTreeSet<ObjectKey>,
    /// Service ports and problems each service contributed.
    pub(super) ports_of: PortsByService,
    pub(super) problems_of: HashMap<ObjectKey, Vec<Problem>>,
    pub(super) wants_node_ports: BTreeSet<ObjectKey>,
    pub(super) health_checks: BTreeMap<ObjectKey, HealthCheck>,
    pub(super) node: NodeContext,
}

/// A service's port names: most services have one, held without an
/// allocation of its own (16 bytes, against a `Vec`'s 24 and its
/// allocation: 4 MB at 100,000 services).
pub(super) type PortNames = Few<ServicePortName>;

impl Desired {
    /// Takes what changed: the node and the service CIDRs when `full`
    /// (every service is then translated part by part as the full
    /// reconcile goes, see `Sync::reconcile_all`), else the changed
    /// services, translated now. Returns the service ports to reconcile
    /// (those the changed services had and have) and whether the
    /// problems the services contribute changed.
    pub(super) fn update(
        &mut self,
        stores: &Stores,
        dirty: &Dirty,
        config: &TranslateConfig,
        full: bool,
    ) -> (BTreeSet<ServicePortName>, bool) {
        let mut names = BTreeSet::new();
        let mut problems_changed = false;
        if dirty.all || dirty.cidrs || full {
            let objects: Vec<_> = stores.service_cidrs().into_iter().collect();
            let cidrs = wanted_service_cidrs(&objects, config);
            if cidrs != self.state.service_cidrs || self.state.nets_version == 0 {
                self.state.service_cidrs = cidrs;
                self.state.nets_version += 1;
            }
        }
        // The cluster IPs are collected from the stores when the
        // reconciler compares the address space (`with_cluster_ips`).
        if dirty.cluster_ips || dirty.all {
            self.state.nets_version += 1;
        }
        if full {
            self.node = NodeContext::new(stores.node(&config.node_name), config);
            self.state.local_sources = self.node.local_sources.clone();
            return (names, true);
        }
        for key in &dirty.services {
            problems_changed |= self.translate(key, stores, config, &mut names);
        }
        (names, problems_changed)
    }

    /// Translates service `key` again: its service ports go into
    /// `state.services`, the names it had and has into `names`, and its
    /// contributions (port names, problems, health check, whether it
    /// wants node ports) replace the ones it made before. Translating an unchanged service changes
    /// nothing but `state.services`. Returns whether its problems changed.
    pub(super) fn translate(
        &mut self,
        key: &ObjectKey,
        stores: &Stores,
        config: &TranslateConfig,
        names: &mut BTreeSet<ServicePortName>,
    ) -> bool {
        let wanted_node_ports = !self.wants_node_ports.is_empty();
        if let Some(old) = self.ports_of.remove(key) {
            for name in old.as_slice() {
                self.state.services.remove(name);
                names.insert(name.clone());
            }
        }
        self.translated.insert(key.clone());
        let old_problems = self.problems_of.remove(key);
        self.wants_node_ports.remove(key);
        self.health_checks.remove(key);
        if let Some(svc) = stores.services.get(key) {
            let t = translate_service(key, svc, &stores.slices_of(key), &self.node, config);
            if t.wants_node_ports {
                self.wants_node_ports.insert(key.clone());
            }
            if let Some(hc) = t.health_check {
                self.health_checks.insert(key.clone(), hc);
            }
            if !t.problems.is_empty() {
                self.problems_of.insert(key.clone(), t.problems);
            }
            let mut new_names = Vec::with_capacity(t.ports.len());
            for (name, desired) in t.ports {
                new_names.push(name.clone());
                names.insert(name.clone());
                self.state.services.insert(name, desired);
            }
            if let Some(new) = PortNames::new(new_names) {
                self.ports_of.insert(new);
            }
        }
        old_problems.as_ref() != self.problems_of.get(key)
            || wanted_node_ports == self.wants_node_ports.is_empty()
    }

    /// Makes sure `state.services` holds service port `name`'s desired
    /// state, if it has one: translates its service unless this
    /// reconcile's translation already did.
    pub(super) fn translate_for(
        &mut self,
        name: &ServicePortName,
        stores: &Stores,
        config: &TranslateConfig,
    ) -> bool {
        let key = service_of(name);
        if self.translated.contains(&key) {
            return false;
        }
        self.translate(&key, stores, config, &mut BTreeSet::new())
    }

    /// Whether service port `name` is desired (its service has it).
    pub(super) fn holds(&self, name: &ServicePortName) -> bool {
        self.ports_of
            .get(&service_of(name))
            .is_some_and(|names| names.as_slice().contains(name))
    }

    /// Collects every service's cluster IPs into `state.cluster_ips` when
    /// the reconciler will compare the service address space with them:
    /// `full`, or a version it has not brought the maps to. Two services
    /// may hold one (a manifest directory): the set holds it once.
    pub(super) fn with_cluster_ips<W: MapWrites>(
        &mut self,
        stores: &Stores,
        config: &TranslateConfig,
        reconciler: &Reconciler<W>,
        full: bool,
    ) {
        if full || reconciler.nets_stale(self.state.nets_version) {
            self.state.cluster_ips = stores
                .services
                .values()
                .flat_map(|svc| service_cluster_ips(svc, config))
                .collect();
        }
    }

    /// Drops the service ports translated for a reconcile, and the
    /// cluster IPs collected for it.
    pub(super) fn forget_translations(&mut self) {
        self.state.services.clear();
        self.state.cluster_ips = Default::default();
        self.translated.clear();
    }

    /// Service ports desired.
    pub(super) fn service_ports(&self) -> usize {
        self.ports_of.values().map(|n| n.as_slice().len()).sum()
    }

    /// The health check node ports to serve (the first service wins a port).
    pub(super) fn health_checks(&self) -> HealthChecks {
        let mut out = HealthChecks::new();
        for (svc, hc) in &self.health_checks {
            out.entry(hc.port)
                .or_insert_with(|| (svc.clone(), hc.local_endpoints));
        }
        out
    }

    /// Every current problem: the node's, the services', the slices', and
    /// the objects that could not be used.
    pub(super) fn problems(&self, stores: &Stores, config: &TranslateConfig) -> BTreeSet<Problem> {
        let mut all: BTreeSet<Problem> = self.node.problems.iter().cloned().collect();
        if !self.wants_node_ports.is_empty() {
            all.extend(self.node.node_port_problems(config));
        }
        all.extend(self.problems_of.values().flatten().cloned());
        all.extend(
            stores
                .slices
                .values()
                .flat_map(|s| s.problems.iter().cloned()),
        );
        all.extend(
            stores
                .service_cidrs
                .values()
                .flat_map(|c| c.problems.iter().cloned()),
        );
        all.extend(stores.rejected.values().cloned());
        all
    }
}

/// The service a service port belongs to.
fn service_of(name: &ServicePortName) -> ObjectKey {
    ObjectKey {
        namespace: name.namespace.clone(),
        name: name.name.clone(),
    }
}
