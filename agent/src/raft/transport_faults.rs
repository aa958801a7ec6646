//! Application-level faults on this agent's outgoing Raft messages (chaos C11; the kernel here
//! has no netem): a seeded, pure decision per message — delay it, lose the request, lose the
//! reply, or send it twice — set and cleared at run time through `NodeService.InjectNetworkFault`
//! when `raft.fault_injection` allows it. `network.rs` carries the decisions out.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_raft_store::NodeId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The longest delay a rule may ask for.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(10);

/// What to do to outgoing Raft messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultRule {
    /// Each message waits a uniformly drawn time in `[delay_min, delay_max]` before it is sent.
    pub delay_min: Duration,
    pub delay_max: Duration,
    /// Per mille of messages lost (half of them before the peer sees them, half on the way back).
    pub drop_per_mille: u32,
    /// Per mille of the messages not lost that are sent twice.
    pub duplicate_per_mille: u32,
    /// The peers whose messages are affected; empty: every peer.
    pub peers: BTreeSet<NodeId>,
}

impl FaultRule {
    /// Why the rule is unusable, if it is.
    pub fn validate(&self) -> Result<(), String> {
        if self.delay_min > self.delay_max {
            return Err(format!(
                "delay_min ({:?}) is above delay_max ({:?})",
                self.delay_min, self.delay_max
            ));
        }
        if self.delay_max > MAX_DELAY {
            return Err(format!("delay_max may be at most {MAX_DELAY:?}"));
        }
        for (name, v) in [
            ("drop_per_mille", self.drop_per_mille),
            ("duplicate_per_mille", self.duplicate_per_mille),
        ] {
            if v > 1000 {
                return Err(format!("{name} must be 0..=1000, not {v}"));
            }
        }
        Ok(())
    }

    /// Whether the rule changes nothing (setting it heals).
    pub fn is_none(&self) -> bool {
        self.delay_max.is_zero() && self.drop_per_mille == 0 && self.duplicate_per_mille == 0
    }
}

/// The fate of one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Wait `delay`, then send `copies` (1 or 2) and answer with the first reply.
    Send { delay: Duration, copies: u8 },
    /// Wait `delay`, then fail without sending.
    LoseRequest { delay: Duration },
    /// Wait `delay`, send, then fail as if the reply never came.
    LoseReply { delay: Duration },
}

/// No fault: send once, now.
pub(crate) const UNTOUCHED: Decision = Decision::Send {
    delay: Duration::ZERO,
    copies: 1,
};

/// A rule with its seeded random stream: the same rule and seed give the same decisions for the
/// same sequence of targets.
#[derive(Debug)]
pub(crate) struct FaultModel {
    rule: FaultRule,
    rng: StdRng,
}

impl FaultModel {
    pub(crate) fn new(rule: FaultRule, seed: u64) -> FaultModel {
        FaultModel {
            rule,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The fate of the next message to `target`.
    pub(crate) fn decide(&mut self, target: NodeId) -> Decision {
        let r = &self.rule;
        if !r.peers.is_empty() && !r.peers.contains(&target) {
            return UNTOUCHED;
        }
        let delay = if r.delay_max > r.delay_min {
            self.rng.random_range(r.delay_min..=r.delay_max)
        } else {
            r.delay_min
        };
        if self.rng.random_range(0..1000) < r.drop_per_mille {
            return if self.rng.random_bool(0.5) {
                Decision::LoseRequest { delay }
            } else {
                Decision::LoseReply { delay }
            };
        }
        let copies = if self.rng.random_range(0..1000) < r.duplicate_per_mille {
            2
        } else {
            1
        };
        Decision::Send { delay, copies }
    }
}

/// The live fault setting shared by the Raft network and the API (no rule: no fault).
#[derive(Clone, Debug, Default)]
pub struct TransportFaults(Arc<Mutex<Option<FaultModel>>>);

impl TransportFaults {
    /// Put `rule` in force with a fresh stream from `seed`; a rule that changes nothing heals.
    pub fn set(&self, rule: FaultRule, seed: u64) {
        let model = (!rule.is_none()).then(|| FaultModel::new(rule, seed));
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = model;
    }

    /// The fate of the next message to `target`.
    pub fn decide(&self, target: NodeId) -> Decision {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .map_or(UNTOUCHED, |m| m.decide(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(drop: u32, dup: u32) -> FaultRule {
        FaultRule {
            delay_min: Duration::from_millis(5),
            delay_max: Duration::from_millis(50),
            drop_per_mille: drop,
            duplicate_per_mille: dup,
            peers: BTreeSet::new(),
        }
    }

    fn draws(rule: FaultRule, seed: u64, n: usize) -> Vec<Decision> {
        let mut m = FaultModel::new(rule, seed);
        (0..n).map(|i| m.decide(1 + (i as u64 % 2))).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_decisions() {
        assert_eq!(draws(rule(200, 200), 7, 200), draws(rule(200, 200), 7, 200));
        assert_ne!(draws(rule(200, 200), 7, 200), draws(rule(200, 200), 8, 200));
    }

    #[test]
    fn rates_and_delays_follow_the_rule() {
        let d = draws(rule(200, 300), 1, 10_000);
        let lost = d
            .iter()
            .filter(|d| !matches!(d, Decision::Send { .. }))
            .count();
        let twice = d
            .iter()
            .filter(|d| matches!(d, Decision::Send { copies: 2, .. }))
            .count();
        // 20 % lost; 30 % of the rest duplicated (2,400 of 10,000): wide margins, no flakes.
        assert!((1_700..2_300).contains(&lost), "lost {lost}");
        assert!((2_000..2_800).contains(&twice), "duplicated {twice}");
        assert!(d.iter().any(|d| matches!(d, Decision::LoseRequest { .. })));
        assert!(d.iter().any(|d| matches!(d, Decision::LoseReply { .. })));
        for x in d {
            let (Decision::Send { delay, .. }
            | Decision::LoseRequest { delay }
            | Decision::LoseReply { delay }) = x;
            assert!((5..=50).contains(&delay.as_millis()), "{delay:?}");
        }
    }

    #[test]
    fn only_the_named_peers_are_touched_and_a_null_rule_heals() {
        let mut only2 = rule(1000, 0);
        only2.peers = BTreeSet::from([2]);
        let mut m = FaultModel::new(only2, 3);
        assert_eq!(m.decide(1), UNTOUCHED);
        assert!(!matches!(m.decide(2), Decision::Send { .. }));

        let faults = TransportFaults::default();
        assert_eq!(faults.decide(2), UNTOUCHED, "nothing set");
        faults.set(rule(1000, 0), 1);
        assert!(!matches!(faults.decide(2), Decision::Send { .. }));
        faults.set(FaultRule::default(), 1);
        assert_eq!(faults.decide(2), UNTOUCHED, "healed");
    }

    #[test]
    fn bad_rules_are_refused() {
        let mut r = rule(0, 0);
        r.delay_min = Duration::from_millis(60);
        assert!(
            r.validate()
                .expect_err("min above max")
                .contains("delay_min")
        );
        let mut r = rule(1001, 0);
        assert!(
            r.validate()
                .expect_err("over 1000")
                .contains("drop_per_mille")
        );
        r = rule(0, 2000);
        assert!(r.validate().is_err());
        r = rule(0, 0);
        r.delay_max = Duration::from_secs(11);
        assert!(r.validate().is_err());
        assert_eq!(rule(1000, 1000).validate(), Ok(()));
    }
}
