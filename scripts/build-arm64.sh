#!/usr/bin/env bash
# Cross-builds the static linux/arm64 release binary on an x86_64 Debian
# machine, from Debian's packages only (the machine's rustup toolchain has
# only the x86_64 target and fetches no other):
#
#   rustc-web, cargo-web          rustc and cargo 1.96 (bookworm-security),
#                                 /usr/bin/rustc and /usr/bin/cargo
#   libstd-rust-web-dev:arm64     the aarch64-unknown-linux-gnu standard library
#   gcc-aarch64-linux-gnu         the C cross-compiler and linker (ring's C
#                                 code), with glibc's static libraries for arm64
#   qemu-user-static              runs the result here (--version, below)
#
# It installs nothing: when a piece is missing it fails and prints the apt
# command to run (as root: `dpkg --add-architecture arm64` first).
#
#   scripts/build-arm64.sh
#
# Writes ${CARGO_TARGET_DIR:-target/image-check}/aarch64-unknown-linux-gnu/
# release/leader-gate (the same target directory scripts/check-image-build.sh
# uses for amd64, away from the debug builds), with the release profile of
# Cargo.toml (fat LTO, opt-level z) and -C target-feature=+crt-static, as
# the Dockerfile builds amd64; then checks it is an arm64 executable,
# statically linked, and prints `leader-gate VERSION` under
# qemu-aarch64-static. About 7 minutes on 2 cores the first time (every
# dependency, for arm64, with Debian's rustc), then 3 to 5 (leader-gate
# itself: the fat LTO link; 2.7 minutes of CPU). scripts/build-image.sh packs it with the amd64
# binary into one two-platform image index.
set -euo pipefail
started=$SECONDS
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=aarch64-unknown-linux-gnu
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target/image-check}")

say() { echo "build-arm64: $*"; }
fail() {
    echo "build-arm64: $*" >&2
    exit 1
}

# --- the pieces, from Debian's packages ----------------------------------
rustc=/usr/bin/rustc
cargo=/usr/bin/cargo
missing=()
[[ -x $rustc ]] || missing+=(rustc-web)
[[ -x $cargo ]] || missing+=(cargo-web)
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
[[ -e /usr/aarch64-linux-gnu/lib/libc.a ]] || missing+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v file >/dev/null || missing+=(file)
if [[ -x $rustc ]]; then
    sysroot=$("$rustc" --print sysroot)
    compgen -G "$sysroot/lib/rustlib/$target/lib/libstd-*.rlib" >/dev/null ||
        missing+=(libstd-rust-web-dev:arm64)
else
    missing+=(libstd-rust-web-dev:arm64)
fi
if ((${#missing[@]})); then
    arch=""
    [[ " ${missing[*]} " == *":arm64 "* ]] && ! dpkg --print-foreign-architectures 2>/dev/null | grep -qx arm64 &&
        arch="dpkg --add-architecture arm64 && "
    fail "missing ${missing[*]}; as root: ${arch}apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
fi
say "$("$rustc" --version), $("$cargo" --version), $(aarch64-linux-gnu-gcc --version | head -n1)"

# --- the build -------------------------------------------------------------
# Debian's cargo and rustc, not the rustup proxies earlier on PATH; the
# flags reach the target only (with --target, build scripts and proc-macros
# are built for the host without them).
(
    unset RUSTUP_TOOLCHAIN CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS CARGO_BUILD_TARGET \
        CARGO_PROFILE_RELEASE_LTO CARGO_PROFILE_RELEASE_CODEGEN_UNITS
    export RUSTC=$rustc RUSTDOC=/usr/bin/rustdoc
    export RUSTFLAGS="-C target-feature=+crt-static"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    export CARGO_TARGET_DIR=$target_dir
    "$cargo" build --release --locked --target "$target" --bin leader-gate
) || fail "cargo build --target $target failed"

# --- the binary --------------------------------------------------------------
binary=$target_dir/$target/release/leader-gate
[[ -x $binary ]] || fail "the build produced no $binary"
description=$(file -L "$binary")
say "$description"
[[ $description == *"ARM aarch64"* ]] || fail "not an arm64 executable: $description"
[[ $description == *"statically linked"* || $description == *"static-pie linked"* ]] ||
    fail "the binary is not statically linked"
[[ $description != *interpreter* ]] || fail "the binary asks for a dynamic loader"
say "size: $(stat -c %s "$binary") bytes"
package_version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
version=$(qemu-aarch64-static "$binary" --version) || fail "it does not run under qemu-aarch64-static"
[[ $version == "leader-gate $package_version" ]] ||
    fail "--version under qemu-aarch64-static printed '$version', want 'leader-gate $package_version'"
say "--version under qemu-aarch64-static: $version"
say "$binary in $((SECONDS - started)) s"
