//! Device numbers: a `dev_t` (as `stat` reports it in `st_rdev`) split into its major and minor
//! numbers, and back, in Linux's encoding (12-bit major and 20-bit minor, in glibc's layout).

/// The major number of a device number.
pub(crate) fn major(dev: u64) -> u32 {
    (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as u32
}

/// The minor number of a device number.
pub(crate) fn minor(dev: u64) -> u32 {
    (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as u32
}

/// The device number of `major:minor`.
pub(crate) fn makedev(major: u32, minor: u32) -> u64 {
    let (major, minor) = (u64::from(major), u64::from(minor));
    ((major & 0xffff_f000) << 32)
        | ((major & 0x0000_0fff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0x0000_00ff)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn numbers_survive_the_round_trip() {
        for (ma, mi) in [
            (1, 3),
            (195, 0),
            (195, 255),
            (195, 256),
            (195, 1_048_575),
            (4095, 7),
        ] {
            let dev = makedev(ma, mi);
            assert_eq!((major(dev), minor(dev)), (ma, mi), "{dev:#x}");
        }
        // As the kernel and glibc lay them out.
        assert_eq!(makedev(195, 0), 0xc300);
        assert_eq!(makedev(195, 300), 0x10_c32c);
        assert_eq!(makedev(195, 300), nix::sys::stat::makedev(195, 300));
    }

    #[test]
    fn dev_null_is_one_three() {
        let rdev = std::fs::metadata("/dev/null").expect("/dev/null").rdev();
        assert_eq!((major(rdev), minor(rdev)), (1, 3));
    }
}
