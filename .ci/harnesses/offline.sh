#!/usr/bin/env bash
# offline.sh CMD [ARG...]: runs CMD where only loopback exists, with HARNESS_OFFLINE=1 in its environment.
#
# CMD runs in a new network namespace (unshare --net, plus --map-root-user when not root) whose one
# interface, lo, is up: everything CMD starts (the mesh, a real agent client) can reach 127.0.0.1
# and nothing else, no DNS, no internet. A server started outside is out of reach, so start it inside
# (the harness tests start their mesh themselves). Where this process routes through nothing but lo
# already (a nested call, a container without network), CMD runs in place.
#
# Exit status: CMD's; 77 when no namespace can be made here (no unshare, or not permitted: needs
# root, or unprivileged user namespaces), so `offline.sh true` probes whether isolation works.
set -euo pipefail
self=$(readlink -f "${BASH_SOURCE[0]}")

if (($# == 0)) || [[ $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$self" >&2
  exit 2
fi

# True when no IPv4 or IPv6 route leaves through an interface other than lo. /proc/self/net follows
# the calling process's namespace; a fresh namespace has no routes at all.
loopback_only() {
  awk 'NR > 1 && $1 != "lo" { other = 1 } END { exit other }' /proc/self/net/route || return 1
  [[ ! -r /proc/self/net/ipv6_route ]] || awk '$NF != "lo" { other = 1 } END { exit other }' /proc/self/net/ipv6_route
}

# Brings lo up unless it is up already (checking needs no privilege, setting needs CAP_NET_ADMIN):
# SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP, so iproute2 need not be installed.
lo_up() {
  python3 -c 'import fcntl, socket, struct
s = socket.socket()
flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
if not flags & 1:
    fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))'
}

run_here() {
  lo_up || { echo "offline.sh: cannot bring up lo here: exit 77" >&2; exit 77; }
  export HARNESS_OFFLINE=1
  exec "$@"
}

if [[ $1 == --in-namespace ]]; then  # the second stage, inside the namespace made below
  shift
  loopback_only || { echo "offline.sh: the new network namespace still routes elsewhere; refusing" >&2; exit 1; }
  run_here "$@"
fi
if loopback_only; then
  run_here "$@"
fi

command -v unshare >/dev/null || { echo "offline.sh: unshare (util-linux) is not installed: exit 77" >&2; exit 77; }
flags=(--net)
((EUID == 0)) || flags+=(--map-root-user)
if ! why=$(unshare "${flags[@]}" true 2>&1); then
  echo "offline.sh: 'unshare ${flags[*]}' is not permitted here (${why:-no message}): exit 77" >&2
  exit 77
fi
exec unshare "${flags[@]}" -- "$self" --in-namespace "$@"
