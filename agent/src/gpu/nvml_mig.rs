//! MIG management on real GPUs through NVML's C API (nvml-wrapper 0.13 wraps only the MIG
//! mode, not GPU/compute instances): read the GPU instances with their placements and MIG
//! device UUIDs, destroy the ones a layout drops, create the missing ones at their exact
//! placement (`nvmlDeviceCreateGpuInstanceWithPlacement`) with one compute instance spanning
//! each. Enabling MIG mode may need a GPU reset the driver only does on an idle GPU; the
//! replicated layout changes only then. Unverified on hardware here (no GPU): it compiles
//! against the NVML headers and is exercised only where a driver is present.
//!
//! `unsafe` is allowed here (the workspace lint is `deny`; the only other exceptions are the
//! executor's fork-to-exec hooks): each block is one NVML call on a handle NVML gave us, with
//! out-pointers to zeroed locals.
#![allow(unsafe_code)]

use std::ffi::c_uint;

use gpu_raft_store::mig::{self, Instance};
use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};

use super::{GpuError, MigDevice};

/// Most GPU instances one profile can have (7 on every MIG GPU so far).
const MAX_INSTANCES: usize = 8;

fn check(what: &str, r: nvmlReturn_t) -> Result<(), GpuError> {
    if r == nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Nvml(format!("{what}: NVML error {r}")))
    }
}

/// One GPU instance as NVML reports it.
struct Gi {
    handle: nvmlGpuInstance_t,
    id: c_uint,
    profile: &'static str,
    start: u8,
}

/// Every GPU instance on `device` (MIG mode on), with its profile name from our tables.
fn instances(nvml: &Nvml, device: &Device<'_>, model: &mig::MigModel) -> Result<Vec<Gi>, GpuError> {
    let lib = nvml.lib();
    let mut out = Vec::new();
    for p in model.profiles {
        // SAFETY: plain NVML calls on a valid device handle with out-pointers to locals.
        unsafe {
            let mut info: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
            if lib.nvmlDeviceGetGpuInstanceProfileInfo(device.handle(), p.nvml_profile, &mut info)
                != nvmlReturn_enum_NVML_SUCCESS
            {
                continue; // not supported by this driver/GPU
            }
            let mut handles: [nvmlGpuInstance_t; MAX_INSTANCES] = std::mem::zeroed();
            let mut count: c_uint = 0;
            check(
                "listing GPU instances",
                lib.nvmlDeviceGetGpuInstances(
                    device.handle(),
                    info.id,
                    handles.as_mut_ptr(),
                    &mut count,
                ),
            )?;
            for &handle in handles.iter().take(count as usize) {
                let mut gi: nvmlGpuInstanceInfo_t = std::mem::zeroed();
                check(
                    "reading a GPU instance",
                    lib.nvmlGpuInstanceGetInfo(handle, &mut gi),
                )?;
                out.push(Gi {
                    handle,
                    id: gi.id,
                    profile: p.name,
                    start: u8::try_from(gi.placement.start).unwrap_or(u8::MAX),
                });
            }
        }
    }
    Ok(out)
}

/// The MIG devices (GPU instance → `MIG-…` UUID) of `device`, or `None` with MIG mode off.
pub(super) fn devices(
    nvml: &Nvml,
    index: u32,
    model: &str,
) -> Result<Option<Vec<MigDevice>>, GpuError> {
    let nvml_err = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
    let device = nvml.device_by_index(index).map_err(nvml_err)?;
    let Some(rules) = mig::model(model) else {
        return Ok(None);
    };
    match device.mig_mode() {
        Ok(m) if m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE => {}
        _ => return Ok(None),
    }
    let gis = instances(nvml, &device, rules)?;
    let lib = nvml.lib();
    let count = device.mig_device_count().map_err(nvml_err)?;
    let mut uuids = Vec::new();
    for i in 0..count {
        let Ok(mig) = device.mig_device_by_index(i) else {
            continue;
        };
        let mut gi_id: c_uint = 0;
        // SAFETY: a valid MIG device handle and an out-pointer to a local.
        let r = unsafe { lib.nvmlDeviceGetGpuInstanceId(mig.handle(), &mut gi_id) };
        if r == nvmlReturn_enum_NVML_SUCCESS
            && let Ok(uuid) = mig.uuid()
        {
            uuids.push((gi_id, uuid));
        }
    }
    Ok(Some(
        gis.iter()
            .map(|g| MigDevice {
                profile: g.profile.to_owned(),
                start: g.start,
                uuid: uuids
                    .iter()
                    .find(|(id, _)| *id == g.id)
                    .map(|(_, u)| u.clone())
                    .unwrap_or_default(),
            })
            .collect(),
    ))
}

/// Make `device` hold exactly `layout` (or MIG off for `None`).
pub(super) fn apply(
    nvml: &Nvml,
    index: u32,
    model: &str,
    layout: Option<&[Instance]>,
) -> Result<Vec<MigDevice>, GpuError> {
    let nvml_err = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
    let rules = mig::model(model).ok_or_else(|| GpuError::BadMigLayout {
        index,
        reason: format!("{model} is not MIG-capable"),
    })?;
    let device = nvml.device_by_index(index).map_err(nvml_err)?;
    let Some(layout) = layout else {
        if let Some(current) = devices(nvml, index, model)? {
            destroy_all(nvml, &device, rules, &current)?;
            device.set_mig_mode(false).map_err(nvml_err)?;
        }
        return Ok(Vec::new());
    };
    rules
        .check(layout)
        .map_err(|reason| GpuError::BadMigLayout { index, reason })?;
    if devices(nvml, index, model)?.is_none() {
        device.set_mig_mode(true).map_err(nvml_err)?;
    }
    let lib = nvml.lib();
    let gis = instances(nvml, &device, rules)?;
    // Destroy what the layout drops (compute instances first).
    for g in &gis {
        let keep = layout
            .iter()
            .any(|i| i.start == g.start && i.profile == g.profile);
        if !keep {
            destroy_gi(nvml, g.handle)?;
        }
    }
    for i in layout {
        if gis
            .iter()
            .any(|g| g.start == i.start && g.profile == i.profile)
        {
            continue;
        }
        let p = rules
            .profile(&i.profile)
            .ok_or_else(|| GpuError::BadMigLayout {
                index,
                reason: format!("unknown profile {}", i.profile),
            })?;
        // SAFETY: NVML calls on valid handles with out-pointers to locals.
        unsafe {
            let mut info: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
            check(
                "reading a GPU instance profile",
                lib.nvmlDeviceGetGpuInstanceProfileInfo(device.handle(), p.nvml_profile, &mut info),
            )?;
            let placement = nvmlGpuInstancePlacement_t {
                start: c_uint::from(i.start),
                size: c_uint::from(p.memory_slices),
            };
            let mut gi: nvmlGpuInstance_t = std::mem::zeroed();
            check(
                "creating a GPU instance",
                lib.nvmlDeviceCreateGpuInstanceWithPlacement(
                    device.handle(),
                    info.id,
                    &placement,
                    &mut gi,
                ),
            )?;
            let mut ci_info: nvml_wrapper_sys::bindings::nvmlComputeInstanceProfileInfo_t =
                std::mem::zeroed();
            check(
                "reading a compute instance profile",
                lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi,
                    compute_profile(p.compute_slices),
                    nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut ci_info,
                ),
            )?;
            let mut ci: nvmlComputeInstance_t = std::mem::zeroed();
            check(
                "creating a compute instance",
                lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id, &mut ci),
            )?;
        }
    }
    Ok(devices(nvml, index, model)?.unwrap_or_default())
}

/// NVML's compute-instance profile index spanning `slices` compute slices.
fn compute_profile(slices: u8) -> c_uint {
    match slices {
        1 => nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        _ => nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    }
}

fn destroy_all(
    nvml: &Nvml,
    device: &Device<'_>,
    rules: &mig::MigModel,
    _current: &[MigDevice],
) -> Result<(), GpuError> {
    for g in instances(nvml, device, rules)? {
        destroy_gi(nvml, g.handle)?;
    }
    Ok(())
}

/// Destroy a GPU instance's compute instances, then the instance.
fn destroy_gi(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(), GpuError> {
    let lib = nvml.lib();
    // SAFETY: NVML calls on a valid GPU instance handle with out-pointers to locals.
    unsafe {
        for profile in 0..=nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE {
            let mut cis: [nvmlComputeInstance_t; MAX_INSTANCES] = std::mem::zeroed();
            let mut count: c_uint = 0;
            if lib.nvmlGpuInstanceGetComputeInstances(gi, profile, cis.as_mut_ptr(), &mut count)
                != nvmlReturn_enum_NVML_SUCCESS
            {
                continue;
            }
            for &ci in cis.iter().take(count as usize) {
                check(
                    "destroying a compute instance",
                    lib.nvmlComputeInstanceDestroy(ci),
                )?;
            }
        }
        check("destroying a GPU instance", lib.nvmlGpuInstanceDestroy(gi))
    }
}
