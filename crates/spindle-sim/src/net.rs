//! The simulated network: every message is delivered after an independent random delay
//! (so messages between two nodes can overtake each other), or lost, or delivered twice;
//! partitions cut pairs of nodes off from each other in both directions. Nothing here
//! knows what a message means.

use crate::rng::SimRng;
use std::collections::BTreeSet;

/// A participant of the simulated cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    Mon,
    Osd(u32),
    Client(u32),
}

impl Node {
    /// A stable number for the trace hash.
    pub fn code(self) -> u64 {
        match self {
            Node::Mon => 0,
            Node::Osd(i) => 1 << 32 | i as u64,
            Node::Client(i) => 2 << 32 | i as u64,
        }
    }
}

/// How the network misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfig {
    pub delay_ms_min: u64,
    pub delay_ms_max: u64,
    /// Messages lost, per million.
    pub loss_ppm: u32,
    /// Messages delivered twice (the copy after its own delay), per million.
    pub duplicate_ppm: u32,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            delay_ms_min: 1,
            delay_ms_max: 20,
            loss_ppm: 0,
            duplicate_ppm: 0,
        }
    }
}

/// Counters of what the network did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NetStats {
    pub sent: u64,
    pub lost: u64,
    pub cut: u64,
    pub duplicated: u64,
}

#[derive(Debug)]
pub struct Network {
    pub config: NetConfig,
    cut: BTreeSet<(Node, Node)>,
    pub stats: NetStats,
}

impl Network {
    pub fn new(config: NetConfig) -> Network {
        Network {
            config,
            cut: BTreeSet::new(),
            stats: NetStats::default(),
        }
    }

    fn key(a: Node, b: Node) -> (Node, Node) {
        if a <= b {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// Cuts `a` and `b` off from each other (both directions).
    pub fn partition(&mut self, a: Node, b: Node) {
        self.cut.insert(Self::key(a, b));
    }

    pub fn heal(&mut self, a: Node, b: Node) {
        self.cut.remove(&Self::key(a, b));
    }

    pub fn heal_all(&mut self) {
        self.cut.clear();
    }

    pub fn connected(&self, a: Node, b: Node) -> bool {
        !self.cut.contains(&Self::key(a, b))
    }

    /// Delivery delays (ms from now) for one message from `from` to `to`: none when it is
    /// lost or the pair is partitioned, two when it is duplicated.
    pub fn route(&mut self, rng: &mut SimRng, from: Node, to: Node) -> Vec<u64> {
        self.stats.sent += 1;
        if !self.connected(from, to) {
            self.stats.cut += 1;
            return Vec::new();
        }
        if rng.chance_ppm(self.config.loss_ppm) {
            self.stats.lost += 1;
            return Vec::new();
        }
        let (lo, hi) = (self.config.delay_ms_min, self.config.delay_ms_max);
        let mut delays = vec![rng.range(lo, hi)];
        if rng.chance_ppm(self.config.duplicate_ppm) {
            self.stats.duplicated += 1;
            delays.push(rng.range(lo, hi));
        }
        delays
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cut_both_ways_until_healed() {
        let mut net = Network::new(NetConfig::default());
        let mut rng = SimRng::new(1);
        net.partition(Node::Osd(1), Node::Mon);
        assert!(net.route(&mut rng, Node::Mon, Node::Osd(1)).is_empty());
        assert!(net.route(&mut rng, Node::Osd(1), Node::Mon).is_empty());
        assert_eq!(net.route(&mut rng, Node::Osd(2), Node::Mon).len(), 1);
        net.heal_all();
        assert_eq!(net.route(&mut rng, Node::Osd(1), Node::Mon).len(), 1);
        assert_eq!(net.stats.cut, 2);
    }

    #[test]
    fn loss_and_duplication_happen_at_their_rates() {
        let mut net = Network::new(NetConfig {
            loss_ppm: 100_000,
            duplicate_ppm: 100_000,
            ..NetConfig::default()
        });
        let mut rng = SimRng::new(2);
        let delivered: usize = (0..10_000)
            .map(|_| net.route(&mut rng, Node::Mon, Node::Client(0)).len())
            .sum();
        assert!((800..1200).contains(&net.stats.lost), "{:?}", net.stats);
        assert!(
            (700..1100).contains(&net.stats.duplicated),
            "{:?}",
            net.stats
        );
        assert_eq!(
            delivered as u64,
            10_000 - net.stats.lost + net.stats.duplicated
        );
    }
}
