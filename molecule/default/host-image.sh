#!/usr/bin/env bash
# Build the lab host image (a Debian trixie systemd host with NetworkManager
# and Podman 5 for Quadlet) without a registry: debootstrap + podman import.
# Idempotent: the image is rebuilt only when the package list changes.
set -euo pipefail

image=${LAB_HOST_IMAGE:-localhost/localinference-lab-host:trixie}
cache=${LAB_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/.lab/cache}
mirror=${LAB_MIRROR:-http://deb.debian.org/debian}
packages=systemd,systemd-sysv,udev,dbus,python3,python3-venv,iproute2,iputils-ping,procps,sudo,
packages+=network-manager,ethtool,podman,crun,netavark,aardvark-dns,iptables,
packages+=rsync,openssh-server,openssh-client,curl,ca-certificates,iperf3,kmod,libnuma1,psmisc,
packages+=python-is-python3
stamp=$(cat "$0" | sha256sum | cut -c1-12)

if podman image exists "$image" \
   && [ "$(podman image inspect --format '{{ index .Labels "lab.stamp" }}' "$image" 2>/dev/null)" = "$stamp" ]; then
  echo "host image $image is current ($stamp)"
  exit 0
fi

mkdir -p "$cache"
rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap trixie into $rootfs (a few minutes)"
debootstrap --variant=minbase --include="$packages" trixie "$rootfs" "$mirror" > "$cache/debootstrap.log" 2>&1 \
  || { tail -20 "$cache/debootstrap.log"; exit 1; }

: > "$rootfs/etc/machine-id"
rm -f "$rootfs/etc/hostname"
# systemd-modules-load fails in a container without loadable modules; the
# other units are noise for a lab host. NetworkManager must own only the
# cluster interface: eth0 (management) stays as Podman configured it.
for unit in systemd-modules-load.service systemd-remount-fs.service getty@tty1.service \
            console-getty.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
# Keep the MAC addresses Podman gives the veths (udev's "persistent" policy
# would derive them from the machine-id and interface name).
mkdir -p "$rootfs/etc/systemd/network"
printf '[Match]\nOriginalName=*\n\n[Link]\nNamePolicy=keep kernel\nMACAddressPolicy=none\n' \
  > "$rootfs/etc/systemd/network/99-default.link"
mkdir -p "$rootfs/etc/NetworkManager/conf.d"
cat > "$rootfs/etc/NetworkManager/conf.d/90-lab-management.conf" <<'CONF'
[keyfile]
unmanaged-devices=interface-name:eth0
[main]
no-auto-default=*
CONF
# Nested Podman inside a lab host (Quadlet): crun works there, runc does not.
mkdir -p "$rootfs/etc/containers"
cat > "$rootfs/etc/containers/containers.conf" <<'CONF'
[engine]
runtime = "crun"
cgroup_manager = "systemd"
[network]
default_subnet = "10.89.0.0/24"
default_subnet_pools = [{"base" = "10.90.0.0/16", "size" = 24}]
[containers]
default_ulimits = ["nofile=20000:20000"]
CONF
cat > "$rootfs/etc/containers/storage.conf" <<'CONF'
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
[storage.options]
# The controller's image store, bind-mounted read-only by the lab: the vLLM
# image is visible here without a registry and without a copy.
additionalimagestores = ["/var/lib/lab-images"]
CONF
mkdir -p "$rootfs/var/lib/lab-images"
echo 'PODMAN_IGNORE_CGROUPSV1_WARNING=1' >> "$rootfs/etc/environment"
rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"*

tar -C "$rootfs" -c . | podman import \
  --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' \
  --change "LABEL lab.stamp=$stamp" - "$image"
echo "built $image ($stamp)"
