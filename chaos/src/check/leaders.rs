//! At most one leader per term (`two-leaders`): over every agent's sampled view (`status`
//! events), no term is led by two different nodes, whoever reported it.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, OpKind, Phase};
use crate::model::Violation;

const NAME: &str = "leaders";

/// Terms that more than one node was seen leading.
pub fn check(history: &[Event]) -> Vec<Violation> {
    let mut by_term: BTreeMap<u64, BTreeMap<u64, BTreeSet<u64>>> = BTreeMap::new();
    for e in history {
        if e.op == OpKind::Status
            && e.phase == Phase::Ok
            && let (Some(term), Some(leader), Some(via)) = (e.term, e.leader, e.via)
        {
            by_term
                .entry(term)
                .or_default()
                .entry(leader)
                .or_default()
                .insert(via);
        }
    }
    by_term
        .into_iter()
        .filter(|(_, leaders)| leaders.len() > 1)
        .map(|(term, leaders)| {
            let seen: Vec<String> = leaders
                .iter()
                .map(|(l, by)| format!("n{l} (seen by {by:?})"))
                .collect();
            Violation::new(
                NAME,
                "two-leaders",
                format!("term {term} led by {}", seen.join(", ")),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(via: u64, term: u64, leader: Option<u64>) -> Event {
        Event {
            via: Some(via),
            term: Some(term),
            leader,
            ..Event::new("observer", Phase::Ok, OpKind::Status)
        }
    }

    #[test]
    fn one_leader_per_term_passes_and_unknown_leaders_are_ignored() {
        let h = [
            seen(1, 1, Some(1)),
            seen(2, 1, Some(1)),
            seen(2, 2, None),
            seen(3, 2, Some(3)),
            seen(1, 2, Some(3)),
        ];
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn finds_two_leaders_in_one_term() {
        let h = [
            seen(1, 4, Some(1)),
            seen(2, 4, Some(2)),
            seen(3, 5, Some(2)),
        ];
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].kind, "two-leaders");
        assert!(v[0].detail.starts_with("term 4"), "{}", v[0].detail);
    }
}
