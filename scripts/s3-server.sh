#!/usr/bin/env bash
# A throwaway S3-compatible server on the loopback address, for the archive
# tier's tests (issue 17): moto's server (PyPI `moto[server]`), which honours
# conditional writes (`If-None-Match: *` and `If-Match`), the ownership
# leases' fence.
#
#   scripts/s3-server.sh start VENV_DIR STATE_DIR   # prints the endpoint
#   scripts/s3-server.sh stop STATE_DIR
#
# `start` installs moto into VENV_DIR (a Python venv, created if missing;
# only PyPI is contacted), starts it on 127.0.0.1 on a free port, waits until
# it answers and prints `http://127.0.0.1:PORT`; its pid goes to
# STATE_DIR/pid, its log to STATE_DIR/log. Use it as
#   export SESSIONLOG_S3_ENDPOINT=$(scripts/s3-server.sh start target/s3-venv target/s3)
set -euo pipefail

MOTO_VERSION="5.2.6"

cmd="${1:-}"
case "$cmd" in
  start)
    venv="${2:?venv dir}"
    state="${3:?state dir}"
    mkdir -p "$state"
    if [ ! -x "$venv/bin/moto_server" ]; then
      python3 -m venv "$venv" >&2
      "$venv/bin/pip" install --quiet "moto[server]==$MOTO_VERSION" >&2
    fi
    # A free port: bind port 0, read what the kernel chose, release it.
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')"
    "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$state/log" 2>&1 &
    echo $! >"$state/pid"
    # Up to 60 s: moto imports slowly on a loaded machine.
    for _ in $(seq 1 300); do
      if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/moto-api/', timeout=1)" 2>/dev/null; then
        echo "http://127.0.0.1:$port"
        exit 0
      fi
      sleep 0.2
    done
    echo "the S3 server did not answer on 127.0.0.1:$port; log:" >&2
    cat "$state/log" >&2
    kill "$(cat "$state/pid")" 2>/dev/null || true
    exit 1
    ;;
  stop)
    state="${2:?state dir}"
    if [ -f "$state/pid" ]; then
      pid="$(cat "$state/pid")"
      kill "$pid" 2>/dev/null || true
      # SIGTERM, then SIGKILL if it is still there after 5 s.
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$state/pid"
    fi
    ;;
  *)
    echo "usage: $0 start VENV_DIR STATE_DIR | stop STATE_DIR" >&2
    exit 2
    ;;
esac
