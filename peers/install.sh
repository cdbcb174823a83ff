#!/usr/bin/env bash
# Installs the benchmark peers from this machine's package registries (Debian packages and
# Maven Central), each bound later to 127.0.0.1 by the harness (`tidemark bench ... --peers`).
#
#   peers/install.sh redis prometheus nats kafka questdb    # or: peers/install.sh all
#
# Debian peers go where apt puts them; Maven peers go to .peers/<name>/libs in the working
# directory (git ignores .peers/). Re-running is cheap: what is there is kept.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${TIDEMARK_PEERS_DIR:-.peers}"

apt_peer() { # name, package, program
  if command -v "$3" >/dev/null 2>&1 || [ -x "/usr/sbin/$3" ] || [ -x "/usr/bin/$3" ]; then
    echo "$1: already installed ($3)"
    return
  fi
  echo "$1: apt-get install $2"
  # shellcheck disable=SC2086 # $2 may name several packages
  sudo_if apt-get install -y -qq --no-install-recommends $2 >/dev/null
}

maven_peer() { # name
  local dir="$root/$1"
  if [ -n "$(ls "$dir/libs" 2>/dev/null)" ]; then
    echo "$1: already installed ($dir/libs)"
    return
  fi
  command -v mvn >/dev/null 2>&1 || { echo "$1: needs Maven (mvn) and a JDK" >&2; return 1; }
  mkdir -p "$dir"
  echo "$1: downloading jars from Maven Central into $dir/libs"
  mvn -q -B -f "$here/$1/pom.xml" dependency:copy-dependencies -DoutputDirectory="$(cd "$dir" && pwd)/libs"
}

sudo_if() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

peers=("$@")
[ ${#peers[@]} -eq 0 ] && { echo "usage: $0 redis|prometheus|nats|kafka|questdb|syslog-ng|s3proxy|pgjdbc|all ..." >&2; exit 2; }
[ "${peers[0]}" = all ] && peers=(redis prometheus nats kafka questdb syslog-ng)
for peer in "${peers[@]}"; do
  case "$peer" in
    redis) apt_peer redis redis-server redis-server ;;
    prometheus) apt_peer prometheus prometheus prometheus ;;
    nats) apt_peer nats nats-server nats-server ;;
    # Installing syslog-ng removes rsyslog.
    syslog-ng) apt_peer syslog-ng "syslog-ng-core syslog-ng-mod-http" syslog-ng ;;
    # S3Proxy and pgjdbc are no benchmark peers: the S3-compatible server the tiering tests
    # start, and the JDBC driver the pg listener's tests connect with.
    kafka|questdb|s3proxy|pgjdbc) maven_peer "$peer" ;;
    *) echo "unknown peer $peer" >&2; exit 2 ;;
  esac
done
