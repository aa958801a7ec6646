#!/usr/bin/env bash
# Build the Debian package gpumesh_<version>_<arch>.deb with dpkg-deb from built binaries: the
# tree deploy/install.sh lays out (unit in /lib/systemd/system), binaries stripped,
# /etc/gpumesh/agent.toml a conffile (0644: it holds no secrets; join tokens and keys are files
# of their own, 0600, which the agent refuses otherwise), the copyright file generated from
# `cargo metadata` (copyright.py), the upstream changelog (CHANGELOG.md) and a Debian changelog
# entry for this build, Depends from dpkg-shlibdeps. The maintainer scripts (postinst, prerm,
# postrm) create the gpumesh user and the data directories and enable (not start) the unit.
# The version is the workspace's plus the commit between releases (version.sh); the binaries
# must have been built from that commit (their --version says), or the build stops.
#
#   deploy/deb/build.sh [--bin-dir target/release] [--out DIR] [--compress xz|gzip|none]
#
# GPUMESH_BUILD_COMMIT and SOURCE_DATE_EPOCH pin the commit and its time (see version.sh); give
# the same GPUMESH_BUILD_COMMIT to the cargo build of the binaries.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin_dir="$repo/target/release"
out="$repo/target/deb"
compress="xz"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --compress) compress="$2"; shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

maintainer="gpumesh maintainers <maintainers@gpumesh.dev>"
. "$here/version.sh"
arch="$(dpkg --print-architecture)"

for b in gpu-agent gpuctl; do
  built="$("$bin_dir/$b" --version)"
  if [ "$built" != "$b $workspace_version (commit $commit)" ]; then
    echo "build.sh: $bin_dir/$b says \"$built\", but this is $workspace_version at commit $commit:" \
      "rebuild it (cargo build --release --bins), with the same GPUMESH_BUILD_COMMIT if one is set" >&2
    exit 2
  fi
done

# The tree is staged where dpkg-shlibdeps looks for a package's files: debian/<package>/.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
stage="$work/debian/gpumesh"
install -d -m 0755 "$stage"
touch "$work/debian/control"

"$repo/deploy/install.sh" --root "$stage" --bin-dir "$bin_dir" \
  --unit-dir /lib/systemd/system --no-enable >/dev/null
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
  "$stage/usr/bin/gpu-agent" "$stage/usr/bin/gpuctl"
# The data, jobs and log directories belong to the host, made by postinst; the package does
# not own them.
rm -rf "$stage/var"

doc="$stage/usr/share/doc/gpumesh"
"$here/copyright.py" --manifest-path "$repo/Cargo.toml" >"$doc/copyright"
gzip -9n <"$repo/CHANGELOG.md" >"$doc/changelog.gz"
{
  echo "gpumesh ($deb_version) unstable; urgency=medium"
  echo
  echo "  * gpumesh $workspace_version, built from commit $commit. The changes users see"
  echo "    are in /usr/share/doc/gpumesh/changelog.gz (CHANGELOG.md)."
  echo
  echo " -- $maintainer  $(LC_ALL=C TZ=UTC date -R -d "@$commit_epoch")"
} | gzip -9n >"$doc/changelog.Debian.gz"
chmod 0644 "$doc"/*
install -D -m 0644 "$here/lintian-overrides" "$stage/usr/share/lintian/overrides/gpumesh"

install -d -m 0755 "$stage/DEBIAN"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$stage/DEBIAN/"
echo "/etc/gpumesh/agent.toml" >"$stage/DEBIAN/conffiles"
# The shared libraries the binaries link and the versions their symbols need (libc6, libgcc-s1).
depends="$(cd "$work" && dpkg-shlibdeps -O -e"$stage/usr/bin/gpu-agent" -e"$stage/usr/bin/gpuctl" \
  | sed -n 's/^shlibs:Depends=//p')"
[ -n "$depends" ] || { echo "build.sh: dpkg-shlibdeps found no dependencies" >&2; exit 2; }
(cd "$stage" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' \
  | LC_ALL=C sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"
size="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
cat >"$stage/DEBIAN/control" <<CONTROL
Package: gpumesh
Version: $deb_version
Architecture: $arch
Maintainer: $maintainer
Section: admin
Priority: optional
Installed-Size: $size
Depends: $depends, passwd, systemd
Homepage: https://github.com/gpumesh/gpumesh
Description: GPU cluster control plane (gpu-agent daemon and gpuctl CLI)
 Every GPU host runs the same gpu-agent. The agents form one Raft group that
 keeps the cluster's inventory and job queue, schedules jobs onto the GPUs and
 runs them; gpuctl talks to any agent.
CONTROL

mkdir -p "$out"
deb="$out/gpumesh_${deb_version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$stage" "$deb" >/dev/null
echo "$deb"
