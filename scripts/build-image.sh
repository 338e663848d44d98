#!/usr/bin/env bash
# Builds the leader-gate image without a Docker engine: an OCI image
# archive that `docker load`, `podman load` and `ctr images import` accept.
#
#   scripts/build-image.sh [--platforms LIST] [--binary PATH] [--binary-arm64 PATH]
#                          [--name NAME] [--tag TAG] [--output FILE]
#
# By default the image is multi-platform: an OCI image index with a
# linux/amd64 and a linux/arm64 (variant v8) image, each manifest's platform
# set. --platforms linux/amd64 (or linux/arm64) writes one platform only
# (the index then has one entry). The binaries are the static release
# binaries that scripts/check-image-build.sh (amd64, by replaying the
# Dockerfile's build stage; default
# target/image-check/x86_64-unknown-linux-gnu/release/leader-gate) and
# scripts/build-arm64.sh (arm64, cross-built from Debian's packages; default
# target/image-check/aarch64-unknown-linux-gnu/release/leader-gate) build;
# --binary and --binary-arm64 put others in.
#
# Each platform's image holds its binary at /usr/local/bin/leader-gate,
# with /etc/passwd, /etc/group and /etc/hosts naming the user 65532 and
# localhost, /etc/nsswitch.conf (hosts: files dns), /tmp, and this
# machine's CA bundle (Debian's ca-certificates) at
# /etc/ssl/certs/ca-certificates.crt: the Kubernetes client loads the
# system's roots whenever the kubeconfig names no CA, and refuses to start
# without any. No shell, no libc. USER 65532:65532, ENTRYPOINT the binary,
# CMD serve --help (as in the Dockerfile), EXPOSE 4040 4041, OCI labels
# (version, description and licence from Cargo.toml, revision from git).
#
# The layout is written by umoci (Debian's package; `umoci repack` makes
# each platform's layer from a directory, `umoci config` its
# configuration); python3 then adds the arm64 variant to its configuration
# and writes the image index (the archive's index.json names that index, as
# `docker buildx --output type=oci` and `ctr images export` do). The
# archive is that OCI layout plus the manifest.json of `docker save`, which
# names the linux/amd64 image only (`docker load` reads it and keeps one
# image per name; containerd and podman read the index and pick a
# platform), packed by GNU tar in a fixed order with fixed owners and times.
# Every time in it is SOURCE_DATE_EPOCH (default: the last commit's time),
# so the same binaries and commit (and CA bundle) give the same bytes.
#
# Default output: target/image/leader-gate-VERSION.oci.tar, named
# leader-gate:VERSION. It prints the archive's path, the image index's
# digest (what a registry serves for the tag after `skopeo copy --all`) and
# each platform's manifest digest. Seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

fail() {
    echo "build-image: $*" >&2
    exit 1
}
usage="usage: $0 [--platforms linux/amd64,linux/arm64] [--binary PATH] [--binary-arm64 PATH] [--name NAME] [--tag TAG] [--output FILE]"

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
description=$(sed -n 's/^description *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
license=$(sed -n 's/^license *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
[[ -n $version ]] || fail "no version in Cargo.toml"

target_dir=${CARGO_TARGET_DIR:-target/image-check}
binary=$target_dir/x86_64-unknown-linux-gnu/release/leader-gate
binary_arm64=$target_dir/aarch64-unknown-linux-gnu/release/leader-gate
platforms=linux/amd64,linux/arm64
name=leader-gate
tag=$version
output=""
while (($#)); do
    case $1 in
    --binary | --binary-arm64 | --platforms | --name | --tag | --output)
        (($# >= 2)) || fail "$1 needs a value ($usage)"
        var=${1#--}
        declare "${var//-/_}=$2"
        shift 2
        ;;
    *) fail "unknown argument '$1' ($usage)" ;;
    esac
done
output=${output:-target/image/$name-$tag.oci.tar}
[[ $name =~ ^[a-z0-9]+([._/-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$ ]] ||
    fail "--name '$name' is not an image name (lowercase, e.g. ghcr.io/example/leader-gate)"
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || fail "--tag '$tag' is not an image tag"

# The platforms, in a fixed order (amd64 first: docker load's).
archs=()
IFS=, read -r -a wanted <<<"$platforms"
for platform in "${wanted[@]}"; do
    case $platform in
    linux/amd64 | linux/arm64 | linux/arm64/v8) ;;
    *) fail "--platforms: '$platform' is not linux/amd64 or linux/arm64" ;;
    esac
done
[[ ,$platforms, == *,linux/amd64,* ]] && archs+=(amd64)
[[ ,$platforms, == *,linux/arm64,* || ,$platforms, == *,linux/arm64/v8,* ]] && archs+=(arm64)
((${#archs[@]})) || fail "--platforms names no platform"

for tool in umoci tar python3; do
    command -v "$tool" >/dev/null ||
        fail "needs $tool (Debian: apt-get install umoci tar python3)"
done
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s $ca_bundle ]] || fail "needs $ca_bundle (Debian: apt-get install ca-certificates)"
declare -A binaries=([amd64]=$binary [arm64]=$binary_arm64)
declare -A builders=(
    [amd64]="scripts/check-image-build.sh builds it (as the Dockerfile does), or pass --binary PATH"
    [arm64]="scripts/build-arm64.sh cross-builds it, or pass --binary-arm64 PATH"
)
for arch in "${archs[@]}"; do
    [[ -x ${binaries[$arch]} ]] ||
        fail "no linux/$arch binary at ${binaries[$arch]}: ${builders[$arch]}; or --platforms with the others only"
done

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
umoci init --layout "$layout"
# As another user than root, umoci records the user's files as root's.
rootless=()
[[ $(id -u) == 0 ]] || rootless=(--rootless)

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

# One image per platform, tagged with its architecture inside the layout
# (index.json is rewritten below).
for arch in "${archs[@]}"; do
    # --- the layer: a root directory, owned by root, every time the same ----
    umoci new --image "$layout:$arch"
    bundle=$work/bundle-$arch
    umoci unpack "${rootless[@]}" --image "$layout:$arch" "$bundle" >/dev/null
    rootfs=$bundle/rootfs
    install -d -m 0755 "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/etc/ssl" "$rootfs/etc/ssl/certs"
    install -m 0644 "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    install -d -m 1777 "$rootfs/tmp"
    install -m 0755 "${binaries[$arch]}" "$rootfs/usr/local/bin/leader-gate"
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
    umoci repack --image "$layout:$arch" \
        --history.created "$created" \
        --history.created_by "scripts/build-image.sh (leader-gate $version, linux/$arch)" \
        "$bundle"

    # --- the configuration ------------------------------------------------------
    umoci config --image "$layout:$arch" --no-history \
        --created "$created" --os linux --architecture "$arch" \
        --config.user 65532:65532 \
        --config.entrypoint /usr/local/bin/leader-gate \
        --config.cmd serve --config.cmd --help \
        --config.exposedports 4040/tcp --config.exposedports 4041/tcp \
        "${label_args[@]}"
done
umoci gc --layout "$layout"

# --- the index, and docker save's manifest.json -----------------------------
# The image index (a blob) lists each platform's manifest with its platform
# (arm64: variant v8, also in its configuration, as buildx writes it).
# index.json names that index as containerd and Docker name what they save
# (io.containerd.image.name: the full reference; ref.name: the tag), and
# manifest.json (Config, RepoTags, Layers) is what `docker load` reads: the
# linux/amd64 image, or the only one. Blobs nothing refers to are removed.
digests=$(python3 - "$layout" "$name" "$tag" "${archs[@]}" <<'EOF'
import hashlib, json, os, sys
layout, name, tag, *archs = sys.argv[1:]
first = name.split("/")[0]
if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
    full = "docker.io/" + ("library/" + name if "/" not in name else name)
else:
    full = name

def blob(digest):
    return "blobs/" + digest.replace(":", "/", 1)

def read(digest):
    with open(f"{layout}/{blob(digest)}", "rb") as f:
        return json.load(f)

def dumps(doc):
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

def write(doc, media_type):
    data = dumps(doc)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(f"{layout}/{blob(digest)}", "wb") as f:
        f.write(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}

with open(f"{layout}/index.json") as f:
    layout_index = json.load(f)
by_tag = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in layout_index["manifests"]}
entries, keep, docker = [], set(), []
for arch in archs:
    entry = by_tag[arch]
    manifest = read(entry["digest"])
    platform = {"architecture": arch, "os": "linux"}
    if arch == "arm64":
        platform["variant"] = "v8"
        config = read(manifest["config"]["digest"])
        config["variant"] = "v8"
        manifest["config"] = write(config, manifest["config"]["mediaType"])
        entry = write(manifest, entry["mediaType"])
    entry = {"mediaType": entry["mediaType"], "digest": entry["digest"],
             "size": entry["size"], "platform": platform}
    entries.append(entry)
    keep |= {entry["digest"], manifest["config"]["digest"]}
    keep |= {layer["digest"] for layer in manifest["layers"]}
    if not docker:
        docker = [{
            "Config": blob(manifest["config"]["digest"]),
            "RepoTags": [f"{name}:{tag}"],
            "Layers": [blob(layer["digest"]) for layer in manifest["layers"]],
        }]
index = write({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
               "manifests": entries}, "application/vnd.oci.image.index.v1+json")
index["annotations"] = {
    "io.containerd.image.name": f"{full}:{tag}",
    "org.opencontainers.image.ref.name": tag,
}
keep.add(index["digest"])
for path, doc in (("index.json", {"schemaVersion": 2, "manifests": [index]}),
                  ("manifest.json", docker)):
    with open(f"{layout}/{path}", "wb") as f:
        f.write(dumps(doc))
blobs = f"{layout}/blobs/sha256"
for file in os.listdir(blobs):
    if "sha256:" + file not in keep:
        os.remove(f"{blobs}/{file}")
print(index["digest"], " ".join(f"linux/{a}={e['digest']}" for a, e in zip(archs, entries)))
EOF
)

mkdir -p "$(dirname "$output")"
tar -C "$layout" --sort=name --format=ustar \
    --owner=0 --group=0 --numeric-owner --mode=a+rX,go-w --mtime="@$SOURCE_DATE_EPOCH" \
    -cf "$output.tmp" oci-layout index.json manifest.json blobs
mv "$output.tmp" "$output"
read -r index_digest manifests <<<"$digests"
echo "build-image: $output ($name:$tag, index $index_digest: $manifests; $(stat -c %s "$output") bytes)"
