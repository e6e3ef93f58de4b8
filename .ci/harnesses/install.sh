#!/usr/bin/env bash
# install.sh [CLIENT...]: installs the pinned real agent clients of clients.txt from the npm registry.
#
# CLIENT is claude-code, codex, pi or openclaw (default: all four), each at every version clients.txt pins
# for it (Codex: 0.169.0 and 0.171.0). Each version goes into its own npm prefix,
# $HARNESS_HOME/CLIENT-VERSION (HARNESS_HOME defaults to ~/.cache/harness-clients), and what runs it is
# linked as $HARNESS_HOME/bin/CLIENT-VERSION, where tests/support/harness.py finds it: the native binary
# (Claude Code, Codex), or a two-line wrapper that runs the client's script with the kit's own node
# (pi, OpenClaw: `node` in clients.txt, npm's node-linux-ARCH package, installed the same way first;
# OpenClaw needs node 24, whatever node runs npm here).
# A client already in place is only linked again (no download), so a second run takes about a second.
# npm works in a staging folder renamed into place when it is done, under a lock: an interrupted or
# concurrent run leaves no half-installed client.
#
# Needs node 20+ and npm (only to run npm) and Linux on x86_64 or aarch64. Exit status 0 when every
# client runs `--version` and says its pinned version.
set -euo pipefail
kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
home=${HARNESS_HOME:-$HOME/.cache/harness-clients}

fail() {
  echo "install.sh: $*" >&2
  exit 1
}

case $(uname -m) in
  x86_64 | amd64) npm_arch=x64 ;;
  aarch64 | arm64) npm_arch=arm64 ;;
  *) npm_arch=unsupported ;;
esac

# Fields of CLIENT's lines in clients.txt, one line per pinned version: package, version, what runs.
pinned() { # CLIENT
  awk -v c="$1" '$1 == c { print $2, $3, $4; found = 1 } END { exit !found }' "$kit/clients.txt"
}

install_pinned() { # CLIENT: every version clients.txt pins
  local lines line
  lines=$(pinned "$1") || fail "unknown client '$1' (clients.txt has: $(awk '!/^#/ { printf "%s ", $1 }' "$kit/clients.txt"))"
  while read -r line; do
    install_client "$1" "$line"
  done <<<"$lines"
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

# What runs the client under PREFIX: its native binary, or its node script (ENTRY is node:PATH).
installed_entry() { # PREFIX ENTRY
  if [[ $2 == node:* ]]; then
    [[ -f $1/node_modules/${2#node:} ]] && echo "$1/node_modules/${2#node:}"
  else
    native_binary "$1" "$2"
  fi
}

install_client() { # CLIENT PINNED-LINE (package version entry)
  local client=$1 package version entry prefix target staging version_out scratch node=""
  read -r package version entry <<<"$2"
  package=${package//\{arch\}/$npm_arch}
  if [[ $entry == node:* ]]; then
    install_pinned node >/dev/null
    node=$home/bin/node-$(pinned node | awk 'NR == 1 { print $2 }')
  fi
  prefix=$home/$client-$version
  if ! target=$(installed_entry "$prefix" "$entry"); then
    echo "install.sh: npm install $package@$version into $prefix" >&2
    staging=$(mktemp -d "$home/.staging-$client.XXXXXX")
    # --ignore-scripts: Claude Code's and Codex's only install script copies the native binary that we link
    # directly; pi has none; OpenClaw's sets up optional bundled plugins (it runs without them).
    npm install --prefix "$staging" --no-audit --no-fund --no-update-notifier --ignore-scripts --omit=dev \
      --loglevel=error "$package@$version" >&2 || { rm -rf "$staging"; fail "npm install $package@$version failed"; }
    chmod 755 "$staging"  # mktemp's 0700 would lock out a test run as another user
    rm -rf "$prefix"
    mv "$staging" "$prefix"
    target=$(installed_entry "$prefix" "$entry") || fail "$package@$version has no $entry for $(uname -m)"
  fi
  mkdir -p "$home/bin"
  if [[ -n $node ]]; then  # a wrapper, replaced atomically
    printf '#!/bin/sh\nexec %q %q "$@"\n' "$(readlink -f "$node")" "$target" >"$home/bin/.$client-$version.tmp"
    chmod 755 "$home/bin/.$client-$version.tmp"
    mv -f "$home/bin/.$client-$version.tmp" "$home/bin/$client-$version"
  else
    ln -sfn "$target" "$home/bin/$client-$version"
  fi
  # A broken download fails here, not in a test. HOME is a scratch folder outside /tmp (Codex warns under /tmp).
  scratch=$(mktemp -d "$home/.version-$client.XXXXXX")
  version_out=$(env -i PATH=/usr/bin:/bin HOME="$scratch" TERM=dumb DISABLE_AUTOUPDATER=1 PI_OFFLINE=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 timeout 60 "$home/bin/$client-$version" --version </dev/null 2>&1) || {
    rm -rf "$scratch"
    rm -f "$home/bin/$client-$version"
    fail "$client $version --version failed: $version_out"
  }
  rm -rf "$scratch"
  [[ $version_out == *"$version"* ]] || { rm -f "$home/bin/$client-$version"; fail "$client --version says '$version_out', not $version"; }
  echo "$client $version: $home/bin/$client-$version (${version_out##*$'\n'})"
}

if [[ ${1-} == -h || ${1-} == --help ]]; then
  sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
  exit 0
fi
[[ $(uname -s) == Linux && $npm_arch != unsupported ]] || fail "the clients' builds used here are Linux x86_64 / aarch64 only"
command -v npm >/dev/null || fail "npm is not installed (node 20+ with npm is needed to install the clients)"
mkdir -p "$home"
exec 9>"$home/.install.lock"
flock 9 2>/dev/null || true  # no flock (util-linux): run unlocked
rm -rf "$home"/.staging-* "$home"/.version-*  # left by an interrupted run
(($#)) || set -- claude-code codex pi openclaw
for client in "$@"; do
  install_pinned "$client"
done
