//! The ways gpumesh is installed, each a module: `deploy/install.sh` into a scratch root, and
//! the Debian package from `deploy/deb/build.sh` (built once for all of them): what it holds,
//! what lintian says of it, and a real `dpkg -i` and `dpkg --purge` of it.

mod deb_contents;
mod dpkg_purge;
mod install_script;
mod lintian;

/// Where the package is built (once per run of this binary).
const WORK: &str = env!("CARGO_TARGET_TMPDIR");
