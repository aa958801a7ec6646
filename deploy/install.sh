#!/usr/bin/env bash
# Install (or uninstall) gpumesh on this host: the gpu-agent and gpuctl binaries, the systemd
# unit, a config file, shell completions and man pages generated from the binaries, and the
# directories the agent needs. See docs/operations.md.
#
#   deploy/install.sh [--bin-dir DIR] [--root DIR] [--no-enable] [--unit-dir DIR]
#   deploy/install.sh --uninstall [--purge] [--root DIR]
#
# --bin-dir  where the built binaries are (default: target/release)
# --root     install into DIR instead of / (a scratch root, or a package's staging tree):
#            no user is created and nothing is enabled there
# --unit-dir where the unit goes, relative to the root (default: /etc/systemd/system; the
#            Debian package uses /lib/systemd/system)
# --no-enable  do not enable the unit (it is never started: configure /etc/gpumesh/agent.toml
#            first, then `systemctl start gpu-agent`)
# --uninstall  stop and disable the unit, remove what was installed; keeps /etc/gpumesh and
#            /var/lib/gpumesh (cluster state!) and /var/lib/gpumesh-jobs unless --purge
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
bin_dir="$repo/target/release"
root=""
unit_dir="/etc/systemd/system"
enable=1
uninstall=0
purge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --root) root="${2%/}"; shift 2 ;;
    --unit-dir) unit_dir="$2"; shift 2 ;;
    --no-enable) enable=0; shift ;;
    --uninstall) uninstall=1; shift ;;
    --purge) purge=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

say() { echo "install.sh: $*"; }
systemd_running() { [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }
if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (or give --root DIR for a scratch root)" >&2
  exit 2
fi

files=(
  /usr/bin/gpu-agent
  /usr/bin/gpuctl
  "$unit_dir/gpu-agent.service"
  /usr/share/bash-completion/completions/gpu-agent
  /usr/share/bash-completion/completions/gpuctl
  /usr/share/zsh/vendor-completions/_gpu-agent
  /usr/share/zsh/vendor-completions/_gpuctl
  /usr/share/fish/vendor_completions.d/gpu-agent.fish
  /usr/share/fish/vendor_completions.d/gpuctl.fish
  /usr/share/doc/gpumesh/operations.md
  /usr/share/doc/gpumesh/agent.example.toml
)

if [ "$uninstall" = 1 ]; then
  if systemd_running; then
    systemctl disable --now gpu-agent.service 2>/dev/null || true
  fi
  for f in "${files[@]}"; do rm -f "$root$f"; done
  rm -f "$root"/usr/share/man/man1/gpu-agent*.1.gz "$root"/usr/share/man/man1/gpuctl*.1.gz
  rmdir "$root/usr/share/doc/gpumesh" 2>/dev/null || true
  if systemd_running; then systemctl daemon-reload; fi
  if [ "$purge" = 1 ]; then
    rm -rf "$root/etc/gpumesh" "$root/var/lib/gpumesh" "$root/var/lib/gpumesh-jobs" "$root/var/log/gpumesh"
    if [ -z "$root" ] && id gpumesh >/dev/null 2>&1; then userdel gpumesh; fi
    say "removed gpumesh, its configuration, its data and the gpumesh user"
  else
    say "removed gpumesh; kept /etc/gpumesh, /var/lib/gpumesh and /var/lib/gpumesh-jobs (--purge removes them)"
  fi
  exit 0
fi

for b in gpu-agent gpuctl; do
  [ -x "$bin_dir/$b" ] || { echo "install.sh: $bin_dir/$b not found (cargo build --release --bins)" >&2; exit 2; }
done

# The user jobs run as by default (jobs.run_as); the agent itself runs as root (it switches to
# job users, manages their cgroups and sets GPU power limits), boxed in by the unit.
if [ -z "$root" ] && ! id gpumesh >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpumesh
  say "created the system user gpumesh (jobs run as it)"
fi

install -d -m 0755 "$root/usr/bin" "$root$unit_dir" "$root/usr/share/man/man1" \
  "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
  "$root/usr/share/fish/vendor_completions.d" "$root/usr/share/doc/gpumesh"
install -m 0755 "$bin_dir/gpu-agent" "$bin_dir/gpuctl" "$root/usr/bin/"
install -m 0644 "$here/systemd/gpu-agent.service" "$root$unit_dir/gpu-agent.service"
install -m 0644 "$repo/docs/operations.md" "$root/usr/share/doc/gpumesh/operations.md"
install -m 0644 "$here/config/agent.example.toml" "$root/usr/share/doc/gpumesh/agent.example.toml"

# Completions and man pages come from the binaries themselves, so they match what is installed.
for b in gpu-agent gpuctl; do
  "$bin_dir/$b" generate completion bash >"$root/usr/share/bash-completion/completions/$b"
  "$bin_dir/$b" generate completion zsh >"$root/usr/share/zsh/vendor-completions/_$b"
  "$bin_dir/$b" generate completion fish >"$root/usr/share/fish/vendor_completions.d/$b.fish"
done
man_tmp="$(mktemp -d)"
trap 'rm -rf "$man_tmp"' EXIT
"$bin_dir/gpu-agent" generate man "$man_tmp"
"$bin_dir/gpuctl" generate man "$man_tmp"
for page in "$man_tmp"/*.1; do
  gzip -9n <"$page" >"$root/usr/share/man/man1/$(basename "$page").gz"
done
chmod 0644 "$root"/usr/share/man/man1/*.1.gz "$root"/usr/share/*-completion*/completions/* 2>/dev/null || true

# Configuration: readable by all, as Debian has it: agent.toml holds no secret (join tokens and
# keys live in files of their own, 0600, and the agent refuses one that others can read).
# Data: the agent's, passable by job users; runs (jobs.dir, beside the data): passable by job
# users, who must reach /var/lib/gpumesh-jobs/<run>/work, which the agent creates and chowns.
install -d -m 0755 "$root/etc/gpumesh"
install -d -m 0711 "$root/var/lib/gpumesh"
install -d -m 0711 "$root/var/lib/gpumesh-jobs"
install -d -m 0750 "$root/var/log/gpumesh"
if [ ! -e "$root/etc/gpumesh/agent.toml" ]; then
  sed -e 's/^# run_as = "nobody"/run_as = "gpumesh"/' \
      "$here/config/agent.example.toml" >"$root/etc/gpumesh/agent.toml"
  chmod 0644 "$root/etc/gpumesh/agent.toml"
  say "wrote /etc/gpumesh/agent.toml: set node_id, advertise and bootstrap/join before starting"
else
  say "kept the existing /etc/gpumesh/agent.toml"
fi

if systemd_running; then
  systemctl daemon-reload
  if [ "$enable" = 1 ]; then
    systemctl enable gpu-agent.service
    say "enabled gpu-agent.service (start it with: systemctl start gpu-agent)"
  fi
else
  say "systemd is not running here (or --root): not enabling the unit"
fi
say "installed gpumesh into ${root:-/}"
