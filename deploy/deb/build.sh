#!/usr/bin/env bash
# Build the Debian package gpumesh_<version>_<arch>.deb with dpkg-deb from built binaries:
# the same tree deploy/install.sh lays out (unit in /lib/systemd/system), binaries stripped,
# /etc/gpumesh/agent.toml a conffile; maintainer scripts create the gpumesh user and the data
# directory and enable (not start) the unit.
#
#   deploy/deb/build.sh [--bin-dir target/release] [--out DIR] [--compress xz|gzip|none]
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

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)"
arch="$(dpkg --print-architecture)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"

"$repo/deploy/install.sh" --root "$stage" --bin-dir "$bin_dir" \
  --unit-dir /lib/systemd/system --no-enable >/dev/null
strip --strip-unneeded "$stage/usr/bin/gpu-agent" "$stage/usr/bin/gpuctl"
# The data directory belongs to the host, made by postinst; the package does not own it.
rm -rf "$stage/var"

install -d -m 0755 "$stage/DEBIAN"
size="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
cat >"$stage/DEBIAN/control" <<CONTROL
Package: gpumesh
Version: $version
Architecture: $arch
Maintainer: gpumesh developers <gpumesh@localhost>
Section: admin
Priority: optional
Installed-Size: $size
Depends: libc6, passwd, systemd
Description: GPU cluster control plane (gpu-agent daemon and gpuctl CLI)
 Every GPU host runs the same gpu-agent; the agents form one Raft group that schedules
 and runs jobs on the cluster's GPUs. gpuctl talks to any agent.
CONTROL
echo "/etc/gpumesh/agent.toml" >"$stage/DEBIAN/conffiles"
cat >"$stage/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  id gpumesh >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin gpumesh
  install -d -m 0711 /var/lib/gpumesh
  install -d -m 0711 /var/lib/gpumesh-jobs
  install -d -m 0750 /var/log/gpumesh
  chmod 0750 /etc/gpumesh
  chmod 0640 /etc/gpumesh/agent.toml
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable gpu-agent.service >/dev/null
  fi
  echo "gpumesh: edit /etc/gpumesh/agent.toml (node_id, listen/advertise, bootstrap or join), then: systemctl start gpu-agent"
fi
SCRIPT
cat >"$stage/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  systemctl disable --now gpu-agent.service >/dev/null 2>&1 || true
fi
SCRIPT
cat >"$stage/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
  rm -rf /var/lib/gpumesh /var/lib/gpumesh-jobs /var/log/gpumesh /etc/gpumesh
  if id gpumesh >/dev/null 2>&1; then userdel gpumesh || true; fi
fi
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SCRIPT
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/gpumesh_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$stage" "$deb" >/dev/null
echo "$deb"
