#!/usr/bin/env bash
# Installs what flexcomm needs on a fresh Debian machine, idempotently:
# Debian's iperf3, iproute2, util-linux (setpriv) and systemd (for the unit's
# systemd-analyze check), then a virtual environment in .venv with
# torch==2.13.0 (the CPU wheel; an unpinned torch pulls gigabytes of CUDA) and
# flexcomm itself in editable mode with the client, agent, lab and dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${FLEXCOMM_VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.flexcomm-installed"

need_apt=()
command -v iperf3 >/dev/null 2>&1 || need_apt+=(iperf3)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)  # iperf3 dies with the agent
if ((${#need_apt[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: need ${need_apt[*]}; run as root or: sudo apt-get install ${need_apt[*]}" >&2
        exit 1
    fi
    echo "bootstrap: apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# pip warns about every package missing from this machine's local mirrors; noise.
pip_quiet() {
    "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2> >(grep -v 'is ignored: it is neither' >&2)
}

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV"
    "$PY" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ setup.py -nt "$STAMP" ]; then
    echo "bootstrap: installing torch==2.13.0 and flexcomm[client,agent,lab,dev] into $VENV"
    pip_quiet "torch==2.13.0"
    pip_quiet -e ".[client,agent,lab,dev]"
    touch "$STAMP"
fi
