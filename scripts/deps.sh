# Sourced by scripts/test and scripts/demo: installs the Debian packages ambit needs when a
# tool is missing. Uses sudo when not root.

# Each step says when it started (UTC), so a log shows where a run's time went.
log() { printf '\033[1m==> %s %s\033[0m\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        log "need root for: $*"; return 1; fi
}

ensure_packages() {
    # binary -> Debian package providing it
    declare -A need=(
        [ip]=iproute2 [ss]=iproute2 [iptables]=iptables [ip6tables]=iptables
        [iptables-restore]=iptables [nft]=nftables [ipset]=ipset [tcpdump]=tcpdump
        [dig]=dnsutils [ps]=procps [sysctl]=procps [python3]=python3 [curl]=curl
    )
    local missing=() bin
    for bin in "${!need[@]}"; do
        command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || [ -x "/sbin/$bin" ] \
            || missing+=("${need[$bin]}")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        local pkgs
        pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
        log "installing missing packages: $pkgs"
        as_root apt-get update -qq
        # shellcheck disable=SC2086
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
    fi
    export PATH="$PATH:/usr/sbin:/sbin"
}

# The image build and its tests: debootstrap makes the root filesystem, podman imports and runs
# it, the kubelet-style test runs it on nodes with the machine's CNI plugins.
ensure_image_tools() {
    local missing=()
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    # crun refuses hybrid cgroup hierarchies (some VMs); the image test falls back to runc.
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
    # The kubelet-style test's primary network: ptp, host-local and loopback in /usr/lib/cni.
    [ -x /usr/lib/cni/ptp ] || missing+=(containernetworking-plugins)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing missing packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    export PATH="$PATH:/usr/sbin:/sbin"
}

# kubernetes-validate (PyPI) for the offline schema check of deploy/kubernetes, pinned with its
# dependencies in scripts/kubernetes-validate.txt and kept in a venv outside the clone, keyed
# by that file, so repeated runs reuse it. Exports AMBIT_KUBERNETES_VALIDATE for the test.
ensure_kubernetes_validate() {
    local pins key venv
    pins="$(dirname "${BASH_SOURCE[0]}")/kubernetes-validate.txt"
    key=$(sha256sum "$pins" | cut -c1-12)
    venv="${AMBIT_CACHE:-$HOME/.cache/ambit}/kubernetes-validate-$key"
    if [ ! -x "$venv/bin/kubernetes-validate" ]; then
        log "installing kubernetes-validate into $venv"
        rm -rf "$venv"
        if ! python3 -m venv "$venv" >/dev/null 2>&1; then
            as_root apt-get update -qq
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$venv"
            python3 -m venv "$venv"
        fi
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$pins"
    fi
    export AMBIT_KUBERNETES_VALIDATE="$venv/bin/kubernetes-validate"
}

# The Windows build and its tests under Wine (docs/windows.md): the x86_64-pc-windows-gnu
# Rust target, Debian's mingw-w64 (linker, dlltool; also builds the Wine test stub) and
# wine64. Installs what is missing; a failed install is an error (scripts/test stops).
WINDOWS_TARGET=x86_64-pc-windows-gnu
ensure_windows_toolchain() {
    if ! rustup target list --installed 2>/dev/null | grep -qx "$WINDOWS_TARGET"; then
        log "installing the Rust target $WINDOWS_TARGET"
        rustup target add "$WINDOWS_TARGET"
    fi
    local missing=()
    command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || missing+=(gcc-mingw-w64-x86-64-win32)
    [ -x /usr/lib/wine/wine64 ] || command -v wine64 >/dev/null 2>&1 || missing+=(wine64)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing missing packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
}
