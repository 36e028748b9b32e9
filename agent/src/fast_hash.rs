//! The hash tables of the agent's hot paths (the stores, the translation,
//! the reconciler): foldhash instead of std's SipHash-1-3. SipHash was
//! about 2% of the agent's CPU from start to ready at 100,000 services
//! (docs/performance.md, issue 17). foldhash is seeded per process, so
//! names chosen by a cluster's users cannot be aimed at one bucket chain
//! across nodes. Tables whose type crosses into other modules' signatures
//! (the drain manager's flow counts) stay on std's.

/// A `std::collections::HashMap` with foldhash (`HashMap::default()`, not
/// `new()`).
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `std::collections::HashSet` with foldhash.
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
