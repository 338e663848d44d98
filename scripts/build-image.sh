#!/usr/bin/env bash
# Builds the leader-gate image without a Docker engine: an OCI image
# archive that `docker load`, `podman load` and `ctr images import` accept.
#
#   scripts/build-image.sh [--binary PATH] [--name NAME] [--tag TAG] [--output FILE]
#
# The image holds the static release binary that scripts/check-image-build.sh
# builds (by replaying the Dockerfile's build stage; default
# target/image-check/x86_64-unknown-linux-gnu/release/leader-gate) at
# /usr/local/bin/leader-gate, with /etc/passwd, /etc/group and /etc/hosts
# naming the user 65532 and localhost, /etc/nsswitch.conf (hosts: files
# dns), /tmp, and this machine's CA bundle (Debian's ca-certificates) at
# /etc/ssl/certs/ca-certificates.crt: the Kubernetes client loads the
# system's roots whenever the kubeconfig names no CA, and refuses to start
# without any. No shell, no libc. USER 65532:65532, ENTRYPOINT the binary,
# CMD serve --help (as in the Dockerfile), EXPOSE 4040 4041, OCI labels
# (version, description and licence from Cargo.toml, revision from git).
#
# The layout is written by umoci (Debian's package; `umoci repack` makes the
# layer from a directory, `umoci config` the configuration). The archive is
# that OCI layout plus the manifest.json of `docker save`, packed by GNU tar
# in a fixed order with fixed owners and times. Every time in it is
# SOURCE_DATE_EPOCH (default: the last commit's time), so the same binary
# and commit (and CA bundle) give the same bytes.
#
# Default output: target/image/leader-gate-VERSION.oci.tar, named
# leader-gate:VERSION. It prints the archive's path and the image's digest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

fail() {
    echo "build-image: $*" >&2
    exit 1
}

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
description=$(sed -n 's/^description *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
license=$(sed -n 's/^license *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
[[ -n $version ]] || fail "no version in Cargo.toml"

binary=${CARGO_TARGET_DIR:-target/image-check}/x86_64-unknown-linux-gnu/release/leader-gate
name=leader-gate
tag=$version
output=""
while (($#)); do
    case $1 in
    --binary | --name | --tag | --output)
        (($# >= 2)) || fail "$1 needs a value"
        declare "${1#--}=$2"
        shift 2
        ;;
    *) fail "unknown argument '$1' (usage: $0 [--binary PATH] [--name NAME] [--tag TAG] [--output FILE])" ;;
    esac
done
output=${output:-target/image/$name-$tag.oci.tar}
[[ $name =~ ^[a-z0-9]+([._/-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$ ]] ||
    fail "--name '$name' is not an image name (lowercase, e.g. ghcr.io/example/leader-gate)"
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || fail "--tag '$tag' is not an image tag"

for tool in umoci tar python3; do
    command -v "$tool" >/dev/null ||
        fail "needs $tool (Debian: apt-get install umoci tar python3)"
done
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s $ca_bundle ]] || fail "needs $ca_bundle (Debian: apt-get install ca-certificates)"
[[ -x $binary ]] ||
    fail "no binary at $binary: scripts/check-image-build.sh builds it (as the Dockerfile does), or pass --binary PATH"

# Every time in the image: the last commit's, unless given.
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
fi
[[ $SOURCE_DATE_EPOCH =~ ^[0-9]+$ ]] || fail "SOURCE_DATE_EPOCH must be seconds since 1970"
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)

work=$(mktemp -d "${TMPDIR:-/tmp}/build-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
layout=$work/oci

# --- the layer: a root directory, owned by root, every time the same --------
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
# As another user than root, umoci records the user's files as root's.
rootless=()
[[ $(id -u) == 0 ]] || rootless=(--rootless)
umoci unpack "${rootless[@]}" --image "$layout:$tag" "$work/bundle" >/dev/null
rootfs=$work/bundle/rootfs
install -d -m 0755 "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/etc/ssl" "$rootfs/etc/ssl/certs"
install -m 0644 "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
install -d -m 1777 "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/usr/local/bin/leader-gate"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
# Runtimes (the kubelet, Docker, containerd with host networking) mount
# their own /etc/hosts over this one; it is for those that do not.
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs"/etc/{passwd,group,hosts,nsswitch.conf}
[[ -n ${rootless[*]} ]] || chown -R 0:0 "$rootfs"
find "$rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
umoci repack --image "$layout:$tag" \
    --history.created "$created" --history.created_by "scripts/build-image.sh (leader-gate $version)" \
    "$work/bundle"

# --- the configuration --------------------------------------------------------
labels=(
    "org.opencontainers.image.title=leader-gate"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.description=$description"
    "org.opencontainers.image.licenses=$license"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.created=$created"
)
label_args=()
for label in "${labels[@]}"; do label_args+=(--config.label "$label"); done
umoci config --image "$layout:$tag" --no-history \
    --created "$created" --os linux --architecture amd64 \
    --config.user 65532:65532 \
    --config.entrypoint /usr/local/bin/leader-gate \
    --config.cmd serve --config.cmd --help \
    --config.exposedports 4040/tcp --config.exposedports 4041/tcp \
    "${label_args[@]}"
umoci gc --layout "$layout"

# --- the archive: the OCI layout and docker save's manifest.json -------------
# index.json names the image as containerd and Docker name what they save
# (io.containerd.image.name: the full reference; ref.name: the tag), and
# manifest.json (Config, RepoTags, Layers) is what `docker load` reads.
digest=$(python3 - "$layout" "$name" "$tag" <<'EOF'
import json, sys
layout, name, tag = sys.argv[1:]
first = name.split("/")[0]
if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
    full = "docker.io/" + ("library/" + name if "/" not in name else name)
else:
    full = name
with open(f"{layout}/index.json") as f:
    index = json.load(f)
(entry,) = index["manifests"]
entry["annotations"] = {
    "io.containerd.image.name": f"{full}:{tag}",
    "org.opencontainers.image.ref.name": tag,
}
def blob(digest):
    return "blobs/" + digest.replace(":", "/", 1)
with open(layout + "/" + blob(entry["digest"])) as f:
    manifest = json.load(f)
docker = [{
    "Config": blob(manifest["config"]["digest"]),
    "RepoTags": [f"{name}:{tag}"],
    "Layers": [blob(layer["digest"]) for layer in manifest["layers"]],
}]
for path, doc in (("index.json", index), ("manifest.json", docker)):
    with open(f"{layout}/{path}", "w") as f:
        json.dump(doc, f, separators=(",", ":"), sort_keys=True)
print(entry["digest"])
EOF
)

mkdir -p "$(dirname "$output")"
tar -C "$layout" --sort=name --format=ustar \
    --owner=0 --group=0 --numeric-owner --mode=a+rX,go-w --mtime="@$SOURCE_DATE_EPOCH" \
    -cf "$output.tmp" oci-layout index.json manifest.json blobs
mv "$output.tmp" "$output"
echo "build-image: $output ($name:$tag, linux/amd64, manifest $digest, $(stat -c %s "$output") bytes)"
