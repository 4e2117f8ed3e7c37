#!/bin/sh
# The file layout of the ambit image, shared by the Dockerfile and scripts/image so both build
# the same image. Run against a root filesystem that already holds /usr/local/bin/ambit:
#
#   deploy/image/layout.sh ROOT
#
# Entry points, as upstream's images name them (one binary; `ambit` picks its role from the
# name it is started under):
#   /usr/local/bin/ztunnel       `ztunnel proxy ztunnel` (the ztunnel chart's args)
#   /usr/local/bin/install-cni   the CNI node agent (the istio-cni chart's command)
#   /usr/local/bin/istio-cni     the CNI plugin
#   /opt/cni/bin/istio-cni       the plugin where upstream's install-cni image keeps it
set -eu
root="${1:?usage: layout.sh ROOT}"
bin="$root/usr/local/bin"
if [ ! -x "$bin/ambit" ]; then
    echo "layout.sh: $bin/ambit is missing or not executable" >&2
    exit 1
fi
for name in ztunnel install-cni istio-cni; do
    ln -sfn ambit "$bin/$name"
done
mkdir -p "$root/opt/cni/bin"
ln -sfn /usr/local/bin/ambit "$root/opt/cni/bin/istio-cni"
# Mount points the charts use; present so the image also runs without them (podman, tests).
mkdir -p "$root/var/run/ztunnel" "$root/var/run/istio-cni" "$root/var/lib/ambit/control" \
    "$root/etc/cni/net.d" "$root/host"
mkdir -p "$root/tmp"
chmod 1777 "$root/tmp"
