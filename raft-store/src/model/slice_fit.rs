//! Whether a slice request could ever be placed on the GPUs the cluster has: the inventory
//! check at submission (the API edge), beside the context-free `validate::slice_request`.
//!
//! A request no GPU of the requested type (any type when none is asked for) can hold would
//! wait forever, so it is refused with the reason. A cluster with no such GPU at all is not
//! judged: a node may register later, and the context-free limits still apply.

use std::collections::BTreeMap;

use crate::model::job::JobSpec;
use crate::model::mig;
use crate::model::node::GpuRecord;
use crate::model::partition::SliceRequest;

/// `Err(reason)` when no GPU among `gpus` that matches `spec.gpu_types` can hold its slice.
pub fn check_inventory<'a>(
    spec: &JobSpec,
    gpus: impl IntoIterator<Item = &'a GpuRecord>,
) -> Result<(), String> {
    let Some(req) = &spec.slice else {
        return Ok(());
    };
    // model name -> memory, of the GPUs the job may use.
    let models: BTreeMap<&str, u64> = gpus
        .into_iter()
        .filter(|g| spec.gpu_types.is_empty() || spec.gpu_types.contains(&g.gpu_type))
        .map(|g| (g.model.as_str(), g.memory_mib))
        .collect();
    if models.is_empty() {
        return Ok(());
    }
    let which = if spec.gpu_types.is_empty() {
        "GPU".to_owned()
    } else {
        format!("{} GPU", spec.gpu_types.join("|"))
    };
    match req {
        SliceRequest::Shared { memory_mib, .. } => {
            let (model, most) = models
                .iter()
                .max_by_key(|(_, m)| **m)
                .map(|(n, m)| (*n, *m))
                .unwrap_or_default();
            if *memory_mib > most {
                return Err(format!(
                    "GPU memory {memory_mib} MiB is more than any {which} in the cluster has \
                     (the largest is {model} with {most} MiB)"
                ));
            }
        }
        SliceRequest::Mig { profile } => {
            let supported = models
                .keys()
                .filter_map(|m| mig::model(m))
                .any(|m| m.profile(profile).is_some());
            if !supported {
                let offers: Vec<String> = models
                    .keys()
                    .map(|m| match mig::model(m) {
                        Some(t) => format!("{m} supports {}", t.names().join(", ")),
                        None => format!("{m} is not MIG-capable"),
                    })
                    .collect();
                return Err(format!(
                    "MIG profile {profile} is not supported by any {which} in the cluster: {}",
                    offers.join("; ")
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(model: &str, ty: &str, mib: u64) -> GpuRecord {
        GpuRecord {
            index: 0,
            uuid: "GPU-x".into(),
            model: model.into(),
            gpu_type: ty.into(),
            memory_mib: mib,
            numa_node: None,
            nvlink_peers: vec![],
            healthy: true,
        }
    }

    fn spec(types: &[&str], slice: SliceRequest) -> JobSpec {
        JobSpec {
            gpus: 1,
            gpu_types: types.iter().map(|t| (*t).to_owned()).collect(),
            slice: Some(slice),
            ..crate::model::validate::job_tests::spec()
        }
    }

    fn shared(mib: u64) -> SliceRequest {
        SliceRequest::Shared {
            memory_mib: mib,
            share: 25,
        }
    }

    fn mig(p: &str) -> SliceRequest {
        SliceRequest::Mig { profile: p.into() }
    }

    #[test]
    fn shared_memory_is_judged_against_the_gpus_present() {
        let a100 = [
            gpu("A100-80GB", "A100", 81_920),
            gpu("T4-16GB", "T4", 15_360),
        ];
        // 100 GiB fits an H200, which this cluster does not have.
        let err = check_inventory(&spec(&[], shared(102_400)), &a100).expect_err("refused");
        assert_eq!(
            err,
            "GPU memory 102400 MiB is more than any GPU in the cluster has \
             (the largest is A100-80GB with 81920 MiB)"
        );
        assert!(check_inventory(&spec(&[], shared(81_920)), &a100).is_ok());
        let err = check_inventory(&spec(&["T4"], shared(20_000)), &a100).expect_err("refused");
        assert!(err.contains("any T4 GPU in the cluster"), "{err}");
        // No GPU of the type at all: not judged here (a node may join).
        assert!(check_inventory(&spec(&["H200"], shared(102_400)), &a100).is_ok());
        assert!(check_inventory(&spec(&[], shared(102_400)), &[]).is_ok());
    }

    #[test]
    fn mig_profile_is_judged_against_the_models_present() {
        let a100 = [gpu("A100-80GB", "A100", 81_920)];
        let err = check_inventory(&spec(&["A100"], mig("1g.5gb")), &a100).expect_err("refused");
        assert!(
            err.starts_with(
                "MIG profile 1g.5gb is not supported by any A100 GPU in the cluster: \
                 A100-80GB supports 1g.10gb"
            ),
            "{err}"
        );
        assert!(check_inventory(&spec(&["A100"], mig("1g.10gb")), &a100).is_ok());
        let both = [
            gpu("A100-80GB", "A100", 81_920),
            gpu("A100-40GB", "A100", 40_960),
        ];
        assert!(check_inventory(&spec(&["A100"], mig("1g.5gb")), &both).is_ok());
        let t4 = [gpu("T4-16GB", "T4", 15_360)];
        let err = check_inventory(&spec(&[], mig("1g.10gb")), &t4).expect_err("refused");
        assert!(err.ends_with("T4-16GB is not MIG-capable"), "{err}");
    }
}
