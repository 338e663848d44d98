#!/usr/bin/env bash
# Proves the image (scripts/build-image.sh: an OCI image index with
# linux/amd64 and linux/arm64) in real container runtimes:
#
# 1. two builds of it are byte-identical;
# 2. `docker load` (Debian's dockerd, on a data root of its own) and
#    `podman load` (on a storage root of its own) accept the archive, both
#    take its linux/amd64 image and agree on its image ID; Docker reports
#    USER 65532:65532, the binary as ENTRYPOINT, ports 4040 and 4041, and
#    the version label of Cargo.toml; `podman pull --platform
#    linux/arm64/v8 oci-archive:...` takes the arm64 image (its ID is the
#    index's arm64 configuration, its architecture arm64);
# 3. containerd (Debian's containerd and runc; its own root, state and
#    socket under a temporary directory, not the system's) imports both
#    platforms (`ctr images import --all-platforms`) and lists them; the
#    linux/arm64 container prints `--version` through qemu-aarch64-static
#    (bind-mounted: no binfmt_misc here) and, without it, fails with "exec
#    format error" (it is not the amd64 binary); the linux/amd64 image runs:
#    with no arguments (ENTRYPOINT and CMD: `serve --help`),
#    `--version`, and `serve` against the tests' fake API server
#    (examples/fake_apiserver.rs, kubeconfig mounted read-only; host
#    network, every listener on 127.0.0.1) until its gate answers
#    `GET /leader` 200 with "leading":true, the process running as uid and
#    gid 65532; then SIGTERM, and the container must exit 0;
# 4. `skopeo copy --all` pushes the archive to a registry (Debian's
#    docker-registry, on 127.0.0.1 with its own storage directory), which
#    then serves the image index with the digest build-image.sh printed and
#    both platforms.
#
# Everything it starts (containerd, dockerd, the fake API server, the
# containers, the registry) is stopped on exit, and its directory removed. It needs root,
# and installs the Debian packages it needs if they are missing.
#
#   scripts/check-image-run.sh [--binary PATH] [--binary-arm64 PATH]
#
# The binaries default to the ones scripts/check-image-build.sh (amd64) and
# scripts/build-arm64.sh (arm64) built (run them first); --binary and
# --binary-arm64 put others in the image (to watch this check fail).
set -euo pipefail
started=$SECONDS
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

say() { echo "check-image-run: $*"; }
fail() {
    echo "check-image-run: FAILED: $*" >&2
    exit 1
}

[[ $(id -u) == 0 ]] || fail "needs root (containerd, dockerd and podman run as root here)"
build_args=()
while (($#)); do
    case $1 in
    --binary | --binary-arm64)
        (($# >= 2)) || fail "usage: $0 [--binary PATH] [--binary-arm64 PATH]"
        build_args+=("$1" "$2")
        shift 2
        ;;
    *) fail "usage: $0 [--binary PATH] [--binary-arm64 PATH]" ;;
    esac
done

# --- what it needs -----------------------------------------------------------
missing=()
for pair in containerd:containerd runc:runc umoci:umoci dockerd:docker.io podman:podman \
    curl:curl python3:python3 qemu-aarch64-static:qemu-user-static skopeo:skopeo \
    docker-registry:docker-registry; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # Where systemd runs, the packages just installed start services of
    # their own; not ours.
    for package in "${missing[@]}"; do
        case $package in
        docker.io) systemctl disable --now docker.socket docker.service >/dev/null 2>&1 || true ;;
        containerd) systemctl disable --now containerd.service >/dev/null 2>&1 || true ;;
        docker-registry) systemctl disable --now docker-registry.service >/dev/null 2>&1 || true ;;
        esac
    done
fi
command -v docker >/dev/null || fail "no docker client (Debian's docker.io ships one)"

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
name=leader-gate
ref=docker.io/library/$name:$version

work=$(mktemp -d "${TMPDIR:-/tmp}/image-run.XXXXXX")
chmod 0755 "$work" # the container's user reads the kubeconfig below it
pids=()
ctr=(ctr --address "$work/containerd/containerd.sock")
cleanup() {
    set +e
    for id in image-check-help image-check-version image-check-serve image-check-arm64 \
        image-check-arm64-bare; do
        "${ctr[@]}" task kill -s SIGKILL "$id" >/dev/null 2>&1
        "${ctr[@]}" task delete "$id" >/dev/null 2>&1
        "${ctr[@]}" containers delete "$id" >/dev/null 2>&1
    done
    # Newest first: dockerd before the containerd it uses.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill "${pids[i]}" 2>/dev/null
        for _ in $(seq 100); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
        kill -9 "${pids[i]}" 2>/dev/null
        wait "${pids[i]}" 2>/dev/null
    done
    # Whatever the runtimes left mounted below the directory (deepest first).
    awk -v w="$work" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r mount; do umount -l "$mount"; done
    rm -rf "$work"
}
trap cleanup EXIT
# wait_for, free_port, start_fake_apiserver, leading.
source "$(dirname "$0")/lib/fake-apiserver.sh"



# --- 1. the image, twice -----------------------------------------------------
scripts/build-image.sh "${build_args[@]}" --output "$work/first.tar" >/dev/null
archive=target/image/$name-$version.oci.tar
built=$(scripts/build-image.sh "${build_args[@]}" --output "$archive")
echo "$built"
index_digest=$(sed -n 's/.*, index \(sha256:[0-9a-f]*\):.*/\1/p' <<<"$built")
[[ -n $index_digest ]] || fail "build-image.sh printed no index digest: $built"
cmp -s "$work/first.tar" "$archive" ||
    fail "two builds of the image differ: $(sha256sum "$work/first.tar" "$archive" | tr '\n' ' ')"
say "two builds are identical: sha256 $(sha256sum "$archive" | cut -d' ' -f1)"

# The index inside: "PLATFORM MANIFEST CONFIG" per line.
mapfile -t platforms < <(python3 - "$archive" <<'EOF'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    def read(digest):
        return json.load(tar.extractfile("blobs/" + digest.replace(":", "/", 1)))
    (top,) = json.load(tar.extractfile("index.json"))["manifests"]
    assert top["mediaType"] == "application/vnd.oci.image.index.v1+json", top["mediaType"]
    for m in read(top["digest"])["manifests"]:
        p = m["platform"]
        platform = "/".join(filter(None, (p["os"], p["architecture"], p.get("variant"))))
        print(platform, m["digest"], read(m["digest"])["config"]["digest"])
EOF
)
amd64_config="" arm64_config=""
for line in "${platforms[@]}"; do
    read -r platform _manifest config <<<"$line"
    case $platform in
    linux/amd64) amd64_config=$config ;;
    linux/arm64/v8) arm64_config=$config ;;
    esac
done
[[ -n $amd64_config && -n $arm64_config && ${#platforms[@]} == 2 ]] ||
    fail "the archive's index lists '${platforms[*]}', want linux/amd64 and linux/arm64/v8"
say "its index: ${platforms[*]%% *}"

# --- 2. docker load, podman load -------------------------------------------
mkdir -p "$work/containerd"
cat >"$work/containerd/config.toml" <<EOF
version = 2
root = "$work/containerd/root"
state = "$work/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$work/containerd/containerd.sock"
[ttrpc]
  address = "$work/containerd/containerd.sock.ttrpc"
[debug]
  address = "$work/containerd/debug.sock"
EOF
containerd --config "$work/containerd/config.toml" >"$work/containerd.log" 2>&1 &
pids+=($!)
wait_for 30 "${ctr[@]}" version || fail "containerd did not start: $(tail -n 5 "$work/containerd.log")"
say "containerd $(containerd --version | awk '{print $3}') on $work/containerd/containerd.sock"

mkdir -p "$work/docker"
dockerd --data-root "$work/docker/data" --exec-root "$work/docker/exec" \
    --pidfile "$work/docker/pid" -H "unix://$work/docker/docker.sock" \
    --containerd "$work/containerd/containerd.sock" \
    --iptables=false --ip6tables=false --bridge=none --storage-driver vfs \
    >"$work/dockerd.log" 2>&1 &
pids+=($!)
export DOCKER_HOST=unix://$work/docker/docker.sock
wait_for 30 docker version || fail "dockerd did not start: $(tail -n 5 "$work/dockerd.log")"
loaded=$(docker load -i "$archive") || fail "docker load refused the archive"
[[ $loaded == *"Loaded image: $name:$version"* ]] || fail "docker load: $loaded"
docker_id=$(docker image inspect --format '{{.Id}}' "$name:$version")
config=$(docker image inspect --format \
    '{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Cmd}}|{{json .Config.ExposedPorts}}|{{index .Config.Labels "org.opencontainers.image.version"}}|{{.Os}}/{{.Architecture}}' \
    "$name:$version")
want="65532:65532|[\"/usr/local/bin/leader-gate\"]|[\"serve\",\"--help\"]|{\"4040/tcp\":{},\"4041/tcp\":{}}|$version|linux/amd64"
[[ $config == "$want" ]] || fail "docker image inspect: got $config, want $want"
say "docker load (dockerd $(dockerd --version | awk '{print $3}' | tr -d ,)): $name:$version, $docker_id, $config"

podman=(podman --root "$work/podman/root" --runroot "$work/podman/run" --storage-driver vfs)
loaded=$("${podman[@]}" load -q -i "$archive" 2>&1) || fail "podman load refused the archive: $loaded"
podman_id=$("${podman[@]}" image inspect --format '{{.Id}}' "$ref")
[[ sha256:$podman_id == "$docker_id" ]] || fail "podman's image ID $podman_id is not docker's $docker_id"
[[ $docker_id == "$amd64_config" ]] || fail "docker and podman loaded $docker_id, not the linux/amd64 image $amd64_config"
say "podman load (podman $(podman --version | awk '{print $3}')): $ref, the same image ID (linux/amd64)"
"${podman[@]}" pull -q --platform linux/arm64/v8 "oci-archive:$archive" >/dev/null 2>"$work/podman-pull.log" ||
    fail "podman pull --platform linux/arm64/v8 refused the archive: $(cat "$work/podman-pull.log")"
arm64=$("${podman[@]}" image inspect --format '{{.Id}} {{.Os}}/{{.Architecture}}' "$ref")
[[ $arm64 == "${arm64_config#sha256:} linux/arm64" ]] ||
    fail "podman pull --platform linux/arm64/v8: got '$arm64', want '${arm64_config#sha256:} linux/arm64'"
say "podman pull --platform linux/arm64/v8: the arm64 image ($arm64)"

# --- 3. containerd: import and run -----------------------------------------
"${ctr[@]}" images import --all-platforms "$archive" >/dev/null || fail "ctr images import refused the archive"
"${ctr[@]}" images check "name==$ref" | grep -q complete || fail "ctr imported no complete $ref"
listed=$("${ctr[@]}" images ls "name==$ref" | awk 'NR == 2 { print $(NF - 1) }')
[[ $listed == linux/amd64,linux/arm64/v8 ]] ||
    fail "ctr images ls: platforms '$listed', want linux/amd64,linux/arm64/v8"
say "ctr images import --all-platforms: $ref ($listed)"

# The arm64 image's binary, in its own container: through the host's
# qemu-aarch64-static (there is no binfmt_misc to start it here), and
# without it, where the kernel must refuse it.
out=$("${ctr[@]}" run --rm --platform linux/arm64/v8 \
    --mount "type=bind,src=$(command -v qemu-aarch64-static),dst=/qemu-aarch64-static,options=rbind:ro" \
    "$ref" image-check-arm64 /qemu-aarch64-static /usr/local/bin/leader-gate --version 2>&1) ||
    fail "the linux/arm64 container under qemu-aarch64-static: $out"
[[ $out == "leader-gate $version" ]] || fail "the linux/arm64 container printed '$out', want 'leader-gate $version'"
if [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
    say "linux/arm64 container: '$out' under qemu-aarch64-static (binfmt_misc runs arm64 here: no run without it)"
else
    set +e
    bare=$("${ctr[@]}" run --rm --platform linux/arm64/v8 "$ref" image-check-arm64-bare \
        /usr/local/bin/leader-gate --version 2>&1)
    set -e
    [[ $bare == *"exec format error"* ]] ||
        fail "the linux/arm64 container without qemu: want 'exec format error', got '$bare'"
    say "linux/arm64 container: '$out' under qemu-aarch64-static, 'exec format error' without"
fi

# No arguments: ENTRYPOINT and CMD (`serve --help`).
help=$("${ctr[@]}" run --rm "$ref" image-check-help 2>&1) ||
    fail "the image's ENTRYPOINT and CMD did not run: $help"
[[ $help == *"--lease-name"* ]] || fail "no arguments: want serve's help, got: $help"
say "no arguments: ENTRYPOINT + CMD print serve's help"

out=$("${ctr[@]}" run --rm "$ref" image-check-version /usr/local/bin/leader-gate --version 2>&1) ||
    fail "--version in the container: $out"
[[ $out == "leader-gate $version" ]] || fail "--version in the container printed '$out'"
say "--version: $out"

# serve, against the fake API server, until it leads.
kube=$work/kube
start_fake_apiserver "$kube" image-check

gate_port=$(free_port)
admin_port=$(free_port)
"${ctr[@]}" run --rm --net-host \
    --mount "type=bind,src=$kube,dst=$kube,options=rbind:ro" \
    --env "KUBECONFIG=$kubeconfig" \
    "$ref" image-check-serve /usr/local/bin/leader-gate serve \
    --lease-name demo-leader --identity image-check \
    --listen "127.0.0.1:$gate_port" --admin-listen "127.0.0.1:$admin_port" \
    --lease-duration 4s --renew-deadline 3s --retry-period 1s \
    >"$work/serve.log" 2>&1 &
serve=$!
body=""
for _ in $(seq 150); do
    leading "$gate_port" && break
    kill -0 "$serve" 2>/dev/null || break
    sleep 0.2
done
[[ $body == *'"leading":true'*' 200' ]] ||
    fail "the containerized serve never led (last /leader: '${body:-no answer}'); its log: $(tail -n 5 "$work/serve.log")"
[[ $body == *'"identity":"image-check"'* ]] || fail "/leader answered for someone else: $body"
say "GET /leader from the container: $body"

pid=$("${ctr[@]}" task ps image-check-serve | awk 'NR == 2 { print $1 }')
ids=$(awk '/^(Uid|Gid):/ { printf "%s %s ", $1, $2 }' "/proc/$pid/status")
[[ $ids == "Uid: 65532 Gid: 65532 " ]] || fail "the container's process runs as $ids, not 65532:65532"
say "its process (pid $pid on the host) runs as uid 65532, gid 65532"

"${ctr[@]}" task kill -s SIGTERM image-check-serve
code=0
wait "$serve" || code=$?
((code == 0)) || fail "after SIGTERM the container exited $code; its log: $(tail -n 5 "$work/serve.log")"
grep -q "stopped" "$work/serve.log" || fail "no 'stopped' line in the container's log"
say "SIGTERM: the container stopped, exit 0"

# --- 4. the push: skopeo copy --all to a registry --------------------------
registry_port=$(free_port)
mkdir -p "$work/registry"
cat >"$work/registry/config.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $work/registry/data
http:
  addr: 127.0.0.1:$registry_port
EOF
docker-registry serve "$work/registry/config.yml" >"$work/registry.log" 2>&1 &
pids+=($!)
wait_for 30 curl -sf "http://127.0.0.1:$registry_port/v2/" ||
    fail "docker-registry did not start: $(tail -n 5 "$work/registry.log")"
pushed=127.0.0.1:$registry_port/monitoring/leader-gate:$version
skopeo copy --quiet --all --dest-tls-verify=false --digestfile "$work/digest" \
    "oci-archive:$archive" "docker://$pushed" >"$work/skopeo.log" 2>&1 ||
    fail "skopeo copy --all refused the archive: $(tail -n 5 "$work/skopeo.log")"
served=$(skopeo inspect --tls-verify=false --raw "docker://$pushed" | sha256sum | cut -d' ' -f1)
[[ sha256:$served == "$index_digest" && $(cat "$work/digest") == "$index_digest" ]] ||
    fail "the registry serves sha256:$served (skopeo's digest file: $(cat "$work/digest")), want the index $index_digest"
for arch in amd64 arm64; do
    got=$(skopeo inspect --tls-verify=false --override-arch "$arch" --format '{{.Os}}/{{.Architecture}}' "docker://$pushed")
    [[ $got == "linux/$arch" ]] || fail "the pushed index for $arch: got '$got', want linux/$arch"
done
say "skopeo copy --all (skopeo $(skopeo --version | awk '{print $3}')): the registry serves $pushed as the index $index_digest, linux/amd64 and linux/arm64"

say "ok in $((SECONDS - started)) s"
