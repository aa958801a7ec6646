//! The tenants of a replay: weights and quotas from a CSV file, registered in the simulated
//! cluster through the agents' own `CreateTenant` command (so `apply` validates them).
//!
//! Format (a header line, then one tenant per line; plain commas, no quoting):
//! `tenant,weight,quota`, where `quota` is empty or `TYPE=GUARANTEED[:BORROW]` entries joined
//! by `;` (the syntax of `gpuctl tenant create --quota`), e.g. `6214e9,2,V100=64:384`.
//! Tenants of the trace without a line are unlimited and weigh 1, as in the agent.

use std::collections::BTreeMap;

use gpu_raft_store::{ApplyResult, ClusterState, Command, LogEntry, Quota, TenantRecord};

/// A tenants file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("tenants file line {line}: {message}")]
pub(crate) struct BadTenant {
    pub line: usize,
    pub message: String,
}

/// Read `text` and create each tenant in `state`.
pub(crate) fn register(state: &mut ClusterState, text: &str) -> Result<(), BadTenant> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    let bad = |line: usize, message: String| BadTenant { line, message };
    let header: Vec<&str> = match lines.next() {
        Some((_, h)) => h.split(',').map(str::trim).collect(),
        None => {
            return Err(bad(
                1,
                "empty; expected the header tenant,weight,quota".into(),
            ));
        }
    };
    if header != ["tenant", "weight", "quota"] {
        return Err(bad(
            1,
            format!("header {header:?}; expected tenant,weight,quota"),
        ));
    }
    for (line, text) in lines.filter(|(_, l)| !l.is_empty()) {
        let cells: Vec<&str> = text.split(',').map(str::trim).collect();
        let [name, weight, quota] = cells[..] else {
            return Err(bad(line, format!("{} cells; expected 3", cells.len())));
        };
        let weight: u32 = weight
            .parse()
            .map_err(|_| bad(line, format!("weight {weight:?} is not a whole number")))?;
        let tenant = TenantRecord {
            quotas: quotas(quota).map_err(|m| bad(line, m))?,
            weight,
            ..TenantRecord::named(name)
        };
        gpu_raft_store::tenant::validate(&tenant).map_err(|m| bad(line, m))?;
        let result = state.apply(&LogEntry {
            proposed_at_ms: 0,
            cmd: Command::CreateTenant { tenant },
            meta: None,
            request: None,
        });
        if let ApplyResult::Rejected { reason } = result {
            return Err(bad(line, reason.to_string()));
        }
    }
    Ok(())
}

fn quotas(text: &str) -> Result<BTreeMap<String, Quota>, String> {
    let mut out = BTreeMap::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (gpu_type, amounts) = entry
            .split_once('=')
            .ok_or_else(|| format!("quota {entry:?} is not TYPE=GUARANTEED[:BORROW]"))?;
        let (guaranteed, borrow) = amounts.split_once(':').unwrap_or((amounts, "0"));
        let whole = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| format!("quota {entry:?}: {v:?} is not a whole number of GPUs"))
        };
        let quota = Quota {
            guaranteed: whole(guaranteed)?,
            borrow: whole(borrow)?,
        };
        if out.insert(gpu_type.to_owned(), quota).is_some() {
            return Err(format!("GPU type {gpu_type:?} has two quotas"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_are_created_with_their_weights_and_quotas() {
        let mut state = ClusterState::new();
        register(&mut state, "tenant,weight,quota\na,2,V100=4:2;T4=1\nb,1,\n").expect("registered");
        let a = &state.tenants["a"];
        assert_eq!(a.weight, 2);
        assert_eq!(a.quotas["V100"].limit(), 6);
        assert_eq!(a.quotas["T4"].borrow, 0);
        assert!(state.tenants["b"].quotas.is_empty());
    }

    #[test]
    fn bad_files_name_the_line() {
        for (text, line) in [
            ("", 1),
            ("name,weight\n", 1),
            ("tenant,weight,quota\na,x,\n", 2),
            ("tenant,weight,quota\na,1,\nb,0,\n", 3),
            ("tenant,weight,quota\na,1,V100\n", 2),
            ("tenant,weight,quota\na,1,V100=1;V100=2\n", 2),
            ("tenant,weight,quota\na,1\n", 2),
        ] {
            let err = register(&mut ClusterState::new(), text).expect_err(text);
            assert_eq!(err.line, line, "{text:?}: {err}");
        }
    }
}
