//! Where nodes sit in the network, as their labels declare it: what gangs are placed inside.

/// The node labels that declare the network topology, narrowest first, each naming the domain
/// the node is in: its NVLink domain (one NVSwitch fabric, such as an NVL72 rack), its rack,
/// its network block (the nodes under one leaf or spine switch). Domains are meant to nest.
/// A gang goes inside the narrowest domain that can hold it (Slurm's topology/block, Kueue's
/// topology-aware scheduling), and must when it names a level (`JobSpec::topology`).
pub const TOPOLOGY_LABELS: [&str; 3] = ["nvlink-domain", "rack", "block"];
