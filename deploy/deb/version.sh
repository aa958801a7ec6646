# Sourced by build.sh: the package version of the tree at $repo, from the workspace version and
# the commit. Sets `commit` (abbreviated, as the binaries embed it), `commit_epoch` (its commit
# time: the changelog's date, so a rebuild of one commit is the same package), and `deb_version`:
#
#   0.1.0-1                          a release: HEAD is tagged v0.1.0
#   0.1.0+git20261206.3439984-1      between releases: the commit's date (UTC) and hash
#
# `+git` sorts after the release it follows and before the next (dpkg --compare-versions), and
# `-1` is the Debian revision of this packaging. GPUMESH_BUILD_COMMIT and SOURCE_DATE_EPOCH pin
# the commit and its time (a tree without git must give both).

workspace_version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)"
git_in() { git -C "$repo" "$@" 2>/dev/null; }

commit="${GPUMESH_BUILD_COMMIT:-$(git_in rev-parse --short=7 HEAD || true)}"
commit="$(printf '%s' "$commit" | tr 'A-F' 'a-f')"
case "$commit" in
  "" | *[!0-9a-f]*)
    echo "version.sh: no commit: build from a git checkout or set GPUMESH_BUILD_COMMIT (hex)" >&2
    exit 2 ;;
esac
commit_epoch="${SOURCE_DATE_EPOCH:-$(git_in log -1 --format=%ct "$commit^{commit}" || true)}"
case "$commit_epoch" in
  "" | *[!0-9]*)
    echo "version.sh: no commit time: build from a git checkout or set SOURCE_DATE_EPOCH" >&2
    exit 2 ;;
esac

if [ "$(git_in tag --points-at HEAD | grep -Fx "v$workspace_version" || true)" != "" ] \
  && [ "$(git_in rev-parse --short=7 HEAD || true)" = "$commit" ]; then
  upstream_version="$workspace_version"
else
  upstream_version="$workspace_version+git$(TZ=UTC date -d "@$commit_epoch" +%Y%m%d).$commit"
fi
deb_version="$upstream_version-1"
