#!/usr/bin/env bash
# Makes the offline data sets of autonorm_core.data available. Idempotent: a second run only checks.
#
#   fashion_mnist                     Debian package dataset-fashion-mnist (MIT), installed with apt-get:
#                                     IDX files in /usr/share/datasets/fashion-mnist/
#   ptb_pos_sample, oanc_pos,         test corpora inside Debian python3-pattern, NOT installed: the .deb
#   pang_lee_polarity
#                                     is downloaded and unpacked (dpkg-deb -x) into
#                                     ${AUTONORM_DATA_DIR:-~/.cache/autonorm-studies}/pattern.
#                                     The corpora are for personal use: they stay there, never in the repo.
#   digits, diabetes                  ship with scikit-learn: nothing to do.
#
# Needs apt-get (Debian/Ubuntu); root or sudo for the install step only.
set -euo pipefail

CACHE_ROOT="${AUTONORM_DATA_DIR:-$HOME/.cache/autonorm-studies}"
PATTERN_DIR="$CACHE_ROOT/pattern"
CORPORA="$PATTERN_DIR/usr/share/doc/python3-pattern/test/corpora"
FMNIST_DIR=/usr/share/datasets/fashion-mnist

log() { printf 'fetch_data: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root (or sudo) to run: $*"
        return 1
    fi
}

# True when apt knows a candidate version of package $1 (i.e. `apt-get update` is not needed).
apt_has() {
    local candidate
    candidate="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    [ -n "$candidate" ] && [ "$candidate" != "(none)" ]
}

ensure_apt_knows() {
    if ! apt_has "$1"; then
        log "apt does not know $1 yet: running apt-get update"
        as_root apt-get update -qq
        apt_has "$1" || { log "package $1 not found in the configured apt sources"; return 1; }
    fi
}

# --- Fashion-MNIST -------------------------------------------------------------------------------
if [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ] && [ -f "$FMNIST_DIR/t10k-labels-idx1-ubyte.gz" ]; then
    log "fashion_mnist: present in $FMNIST_DIR"
else
    ensure_apt_knows dataset-fashion-mnist
    # --reinstall restores the files when the package is registered as installed but they are gone.
    reinstall=()
    dpkg-query -W -f='${Status}' dataset-fashion-mnist 2>/dev/null | grep -q 'ok installed' && reinstall=(--reinstall)
    log "fashion_mnist: installing dataset-fashion-mnist"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${reinstall[@]}" \
        dataset-fashion-mnist
    [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ] || { log "fashion_mnist: files missing after install"; exit 1; }
fi

# --- python3-pattern corpora ---------------------------------------------------------------------
if [ -f "$CORPORA/tagged-en-wsj.txt" ] && [ -f "$CORPORA/tagged-en-oanc.txt" ] && [ -f "$CORPORA/polarity-en-pang&lee2.csv" ]; then
    log "pattern corpora: present in $CORPORA"
else
    ensure_apt_knows python3-pattern
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    log "pattern corpora: downloading python3-pattern (not installed, only unpacked)"
    # apt-get download writes into the current directory; _apt must be able to write there when root.
    chmod 0777 "$tmp"
    (cd "$tmp" && apt-get download -qq python3-pattern)
    deb="$(find "$tmp" -maxdepth 1 -name 'python3-pattern_*.deb' | head -n 1)"
    [ -n "$deb" ] || { log "apt-get download produced no .deb"; exit 1; }
    # Unpack into a staging dir and move it into place, so an interrupted run never leaves a
    # half-extracted tree that the check above would accept.
    mkdir -p "$CACHE_ROOT"
    staging="$(mktemp -d "$CACHE_ROOT/.pattern.XXXXXX")"
    dpkg-deb -x "$deb" "$staging"
    [ -f "$staging/usr/share/doc/python3-pattern/test/corpora/tagged-en-wsj.txt" ] \
        || { rm -rf "$staging"; log "the package holds no test corpora"; exit 1; }
    rm -rf "$PATTERN_DIR"
    mv "$staging" "$PATTERN_DIR"
    log "pattern corpora: extracted to $CORPORA"
fi

log "done (digits and diabetes ship with scikit-learn)"
