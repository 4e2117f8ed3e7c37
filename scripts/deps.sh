# Sourced by scripts/test and scripts/demo: installs the Debian packages ambit needs when a
# tool is missing. Uses sudo when not root.

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

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
