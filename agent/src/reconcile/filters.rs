//! The loaded programs' filters (`sluice_common::filter`): a bitmap of
//! frontend addresses that `sl_ingress` tests before it looks a
//! destination up in the service maps, and one of backend ports that
//! `sl_egress` tests before its conntrack lookup.
//!
//! They may pass more than they must, never less: a bit is set before the
//! frontend or backend that needs it is written, and cleared only by
//! `fill`, from what is programmed, after a full reconcile. `fill` also
//! writes every word once, from the maps the agent adopted, before the
//! programs are attached; until a word is written it passes everything.

use std::{collections::BTreeMap, net::IpAddr};

use sluice_common::filter::{
    addr4_slot, addr6_slot, port_slot, FE_FILTER_WORDS, PORT_FILTER_WORDS, WORD_WRITTEN,
};

use super::MapState;
use crate::datapath::{Filter, MapWrites, WriteError};

/// What the filter maps hold (each word as last written; 0: never).
pub(super) struct Filters {
    frontends: Vec<u64>,
    ports: Vec<u64>,
}

/// Word and bit of a frontend address.
pub(super) fn addr_slot(addr: IpAddr) -> (u32, u32) {
    match addr {
        IpAddr::V4(a) => addr4_slot(u32::from_ne_bytes(a.octets())),
        IpAddr::V6(a) => addr6_slot(&a.octets()),
    }
}

/// The words each filter should hold for `programmed`, all written.
fn words_of(programmed: &MapState) -> (Vec<u64>, Vec<u64>) {
    let mut frontends = vec![WORD_WRITTEN; FE_FILTER_WORDS as usize];
    for key in programmed.frontends.keys() {
        let (w, b) = addr_slot(key.addr);
        frontends[w as usize] |= 1 << b;
    }
    let mut ports = vec![WORD_WRITTEN; PORT_FILTER_WORDS as usize];
    for backend in programmed.backends.values() {
        let (w, b) = port_slot(backend.port);
        ports[w as usize] |= 1 << b;
    }
    (frontends, ports)
}

impl Filters {
    /// Nothing written: both filters pass everything.
    pub(super) fn new() -> Self {
        Self {
            frontends: vec![0; FE_FILTER_WORDS as usize],
            ports: vec![0; PORT_FILTER_WORDS as usize],
        }
    }

    /// Brings every word to what `programmed` needs: all of them at
    /// adoption, then (after a full reconcile) the words of bits nothing
    /// needs any more.
    pub(super) fn fill<W: MapWrites>(
        &mut self,
        writer: &mut W,
        programmed: &MapState,
    ) -> Result<(), WriteError> {
        let (frontends, ports) = words_of(programmed);
        self.write_changed(writer, Filter::Frontends, &frontends)?;
        self.write_changed(writer, Filter::Ports, &ports)
    }

    /// Makes the frontend filter pass `addrs` (before their frontends
    /// are written).
    pub(super) fn admit_addrs<W: MapWrites>(
        &mut self,
        writer: &mut W,
        addrs: impl IntoIterator<Item = IpAddr>,
    ) -> Result<(), WriteError> {
        let words = admit(&self.frontends, addrs.into_iter().map(addr_slot));
        self.write(writer, Filter::Frontends, &words)
    }

    /// Makes the port filter pass `ports` (before their backends are
    /// written).
    pub(super) fn admit_ports<W: MapWrites>(
        &mut self,
        writer: &mut W,
        ports: impl IntoIterator<Item = u16>,
    ) -> Result<(), WriteError> {
        let words = admit(&self.ports, ports.into_iter().map(port_slot));
        self.write(writer, Filter::Ports, &words)
    }

    fn words(&mut self, filter: Filter) -> &mut Vec<u64> {
        match filter {
            Filter::Frontends => &mut self.frontends,
            Filter::Ports => &mut self.ports,
        }
    }

    /// Writes the words of `want` that differ from what the map holds.
    fn write_changed<W: MapWrites>(
        &mut self,
        writer: &mut W,
        filter: Filter,
        want: &[u64],
    ) -> Result<(), WriteError> {
        let words: Vec<(u32, u64)> = want
            .iter()
            .zip(self.words(filter).iter())
            .enumerate()
            .filter(|(_, (want, have))| want != have)
            .map(|(i, (want, _))| (i as u32, *want))
            .collect();
        self.write(writer, filter, &words)
    }

    /// Writes `words`, keeping the record exact when only some go in.
    fn write<W: MapWrites>(
        &mut self,
        writer: &mut W,
        filter: Filter,
        words: &[(u32, u64)],
    ) -> Result<(), WriteError> {
        if words.is_empty() {
            return Ok(());
        }
        let result = writer.put_filter(filter, words);
        let written = result.as_ref().err().map_or(words.len(), |(n, _)| *n);
        let record = self.words(filter);
        for (i, word) in &words[..written] {
            record[*i as usize] = *word;
        }
        result.map_err(|(_, e)| e)
    }
}

/// The written words of `have` that lack a bit of `slots`, with the bits
/// added (each word once). A word never written passes already.
fn admit(have: &[u64], slots: impl Iterator<Item = (u32, u32)>) -> Vec<(u32, u64)> {
    let mut words: BTreeMap<u32, u64> = BTreeMap::new();
    for (w, b) in slots {
        let current = have[w as usize];
        if current & WORD_WRITTEN == 0 || current & (1 << b) != 0 {
            continue;
        }
        *words.entry(w).or_insert(current) |= 1 << b;
    }
    words.into_iter().collect()
}
