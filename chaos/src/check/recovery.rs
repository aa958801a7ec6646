//! Writes resume after the heal: some submission invoked after the last heal is acknowledged
//! within `LIVENESS_BOUND` of the heal (`no-recovery`). The heal is the nemesis event whose
//! value starts with `nemesis::HEALED`; a history without one is not checked.

use std::time::Duration;

use crate::history::{Event, OpKind, Phase};
use crate::model::Violation;
use crate::nemesis::HEALED;

const NAME: &str = "recovery";

/// How long a healed cluster may take to acknowledge a write again. A safety bound for a
/// shared, loaded 2-core machine, not a performance target.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(10);

/// `no-recovery` when no write invoked after the last heal was acknowledged in time.
pub fn check(history: &[Event]) -> Vec<Violation> {
    let Some(healed) = history
        .iter()
        .rev()
        .find(|e| {
            e.op == OpKind::Nemesis
                && e.phase == Phase::Ok
                && e.value.as_deref().is_some_and(|v| v.starts_with(HEALED))
        })
        .map(|e| e.time_ns)
    else {
        return Vec::new();
    };
    let bound = u64::try_from(LIVENESS_BOUND.as_nanos()).unwrap_or(u64::MAX);
    let mut invoked_after: Vec<&str> = Vec::new();
    for e in history.iter().filter(|e| e.op == OpKind::Submit) {
        match e.phase {
            Phase::Invoke if e.time_ns >= healed => invoked_after.push(&e.process),
            Phase::Ok
                if e.time_ns <= healed.saturating_add(bound)
                    && invoked_after.contains(&e.process.as_str()) =>
            {
                return Vec::new();
            }
            _ => {}
        }
    }
    vec![Violation::new(
        NAME,
        "no-recovery",
        format!(
            "no submission invoked after the heal was acknowledged within {LIVENESS_BOUND:?} \
             ({} invoked)",
            invoked_after.len()
        ),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time_ns: u64, process: &str, phase: Phase, op: OpKind) -> Event {
        Event {
            time_ns,
            value: (op == OpKind::Nemesis).then(|| format!("{HEALED} (restarted [])")),
            ..Event::new(process, phase, op)
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_write_acknowledged_soon_after_the_heal_passes() {
        let h = [
            at(0, "w0", Phase::Invoke, OpKind::Submit),
            at(S, "nemesis", Phase::Ok, OpKind::Nemesis),
            at(2 * S, "w0", Phase::Ok, OpKind::Submit),
            at(3 * S, "w1", Phase::Invoke, OpKind::Submit),
            at(4 * S, "w1", Phase::Ok, OpKind::Submit),
        ];
        assert_eq!(check(&h), vec![]);
        assert_eq!(check(&h[..1]), vec![], "no heal, nothing to check");
    }

    #[test]
    fn finds_writes_that_did_not_resume() {
        let late = [
            at(0, "nemesis", Phase::Ok, OpKind::Nemesis),
            at(S, "w1", Phase::Invoke, OpKind::Submit),
            at(S + 11 * S, "w1", Phase::Ok, OpKind::Submit),
        ];
        assert_eq!(check(&late)[0].kind, "no-recovery");
        let none = [
            at(0, "nemesis", Phase::Ok, OpKind::Nemesis),
            at(S, "w1", Phase::Invoke, OpKind::Submit),
            at(2 * S, "w1", Phase::Info, OpKind::Submit),
        ];
        assert_eq!(check(&none)[0].kind, "no-recovery");
    }
}
