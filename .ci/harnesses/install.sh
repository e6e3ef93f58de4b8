#!/usr/bin/env bash
# install.sh [CLIENT...]: installs the pinned real agent clients of clients.txt from the npm registry.
#
# CLIENT is claude-code or codex (default: both). Each goes into its own npm prefix,
# $HARNESS_HOME/CLIENT-VERSION (HARNESS_HOME defaults to ~/.cache/harness-clients), and its native
# binary is linked as $HARNESS_HOME/bin/CLIENT-VERSION, where tests/support/harness.py finds it.
# A client already in place is only linked again (no download), so a second run takes well under a
# second. npm works in a staging folder renamed into place when it is done, under a lock: an
# interrupted or concurrent run leaves no half-installed client.
#
# Needs node and npm (node 20 is enough: both clients are native executables, node only installs
# them) and Linux on x86_64 or aarch64. Exit status 0 when every client runs `--version`.
set -euo pipefail
kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
home=${HARNESS_HOME:-$HOME/.cache/harness-clients}

fail() {
  echo "install.sh: $*" >&2
  exit 1
}

# Fields of CLIENT's line in clients.txt: package, version, binary glob.
pinned() { # CLIENT
  awk -v c="$1" '$1 == c { print $2, $3, $4; found = 1 } END { exit !found }' "$kit/clients.txt"
}

# The native binary under PREFIX matching GLOB (npm installs only this platform's package), or nothing.
native_binary() { # PREFIX GLOB
  local candidate
  for candidate in "$1"/node_modules/$2; do
    if [[ -f $candidate && -x $candidate ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

install_client() { # CLIENT
  local client=$1 package version glob prefix binary staging version_out scratch
  read -r package version glob < <(pinned "$client") || fail "unknown client '$client' (clients.txt has: $(awk '!/^#/ { printf "%s ", $1 }' "$kit/clients.txt"))"
  prefix=$home/$client-$version
  if ! binary=$(native_binary "$prefix" "$glob"); then
    echo "install.sh: npm install $package@$version into $prefix" >&2
    staging=$(mktemp -d "$home/.staging-$client.XXXXXX")
    # --ignore-scripts: the clients' only install script copies the native binary that we link directly.
    npm install --prefix "$staging" --no-audit --no-fund --no-update-notifier --ignore-scripts --omit=dev \
      --loglevel=error "$package@$version" >&2 || { rm -rf "$staging"; fail "npm install $package@$version failed"; }
    chmod 755 "$staging"  # mktemp's 0700 would lock out a test run as another user
    rm -rf "$prefix"
    mv "$staging" "$prefix"
    binary=$(native_binary "$prefix" "$glob") || fail "$package@$version has no native binary for $(uname -m) ($glob)"
  fi
  # A broken download fails here, not in a test. HOME is a scratch folder outside /tmp (Codex warns under /tmp).
  scratch=$(mktemp -d "$home/.version-$client.XXXXXX")
  version_out=$(env -i PATH=/usr/bin:/bin HOME="$scratch" TERM=dumb DISABLE_AUTOUPDATER=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 timeout 60 "$binary" --version </dev/null 2>&1) || {
    rm -rf "$scratch"
    fail "$binary --version failed: $version_out"
  }
  rm -rf "$scratch"
  [[ $version_out == *"$version"* ]] || fail "$binary --version says '$version_out', not $version"
  mkdir -p "$home/bin"
  ln -sfn "$binary" "$home/bin/$client-$version"
  echo "$client $version: $home/bin/$client-$version (${version_out##*$'\n'})"
}

if [[ ${1-} == -h || ${1-} == --help ]]; then
  sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
  exit 0
fi
[[ $(uname -s) == Linux ]] || fail "the clients' native builds used here are Linux-only"
command -v npm >/dev/null || fail "npm is not installed (node 20+ with npm is needed to install the clients)"
mkdir -p "$home"
exec 9>"$home/.install.lock"
flock 9 2>/dev/null || true  # no flock (util-linux): run unlocked
rm -rf "$home"/.staging-* "$home"/.version-*  # left by an interrupted run
(($#)) || set -- claude-code codex
for client in "$@"; do
  install_client "$client"
done
