#!/usr/bin/env bash
# Installs the Debian packages the fault harness (scripts/chaos) and the Kafka client tests
# (kcat) and the latency bench's peer (nats-server, scripts/bench_latency.py) need, only those missing.
# Idempotent: a second run installs nothing. Needs root (apt-get); without root it only says
# what is missing and how to install it, and exits 2.
#
#   scripts/system-deps.sh           # install what is missing
#   scripts/system-deps.sh --check   # report only; exit 0 if all present, 2 otherwise
#
# Sourcing it (`. scripts/system-deps.sh`) defines `ensure_system_deps` without running it.
set -uo pipefail

# command -> Debian package that provides it
SYSTEM_DEPS_COMMANDS=(
  "ip:iproute2"
  "tc:iproute2"
  "nft:nftables"
  "faketime:faketime"
  "sysctl:procps"
  "mount:mount"
  "umount:mount"
  "kcat:kcat"
  "nats-server:nats-server"
)
# libraries checked by path (the faketime command needs the preload library)
SYSTEM_DEPS_FILES=(
  "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1:libfaketime"
)

system_deps_missing() {
  local entry cmd pkg path missing=()
  for entry in "${SYSTEM_DEPS_COMMANDS[@]}"; do
    cmd=${entry%%:*}; pkg=${entry#*:}
    if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ] && [ ! -x "/sbin/$cmd" ]; then
      missing+=("$pkg")
    fi
  done
  for entry in "${SYSTEM_DEPS_FILES[@]}"; do
    path=${entry%%:*}; pkg=${entry#*:}
    # The multiarch directory differs by architecture: accept any libfaketime.so.1.
    if [ ! -e "$path" ] && ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
      missing+=("$pkg")
    fi
  done
  printf '%s\n' "${missing[@]}" | sort -u | grep -v '^$' || true
}

ensure_system_deps() {
  local missing
  missing=$(system_deps_missing | tr '\n' ' ')
  missing=${missing% }
  if [ -z "$missing" ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "system-deps: missing Debian packages: $missing" >&2
    echo "  the fault harness needs them; as root run: apt-get install -y $missing" >&2
    echo "  (or run scripts/system-deps.sh as root)" >&2
    return 2
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: missing packages ($missing) and no apt-get here; install them with this system's package manager" >&2
    return 2
  fi
  echo "system-deps: installing $missing" >&2
  # One update per call; quiet unless it fails.
  if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq >/tmp/system-deps-apt.log 2>&1; then
    echo "system-deps: apt-get update failed; see /tmp/system-deps-apt.log" >&2
    return 2
  fi
  # shellcheck disable=SC2086 # a list of package names
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >>/tmp/system-deps-apt.log 2>&1; then
    echo "system-deps: apt-get install $missing failed; see /tmp/system-deps-apt.log" >&2
    return 2
  fi
  missing=$(system_deps_missing | tr '\n' ' ')
  if [ -n "${missing% }" ]; then
    echo "system-deps: still missing after install: $missing" >&2
    return 2
  fi
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  if [ "${1:-}" = "--check" ]; then
    missing=$(system_deps_missing | tr '\n' ' ')
    if [ -n "${missing% }" ]; then
      echo "system-deps: missing: ${missing% }" >&2
      exit 2
    fi
    echo "system-deps: all present"
    exit 0
  fi
  ensure_system_deps
  exit $?
fi
