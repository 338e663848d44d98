#!/usr/bin/env bash
# Proves what can be proved about the image without a Docker engine:
#
# 1. the build stage builds: the files its COPY lines name (nothing else) are
#    copied into a clean temporary directory, its ARG/ENV lines are set and
#    its RUN lines run there, in order, as `docker build` would run them;
# 2. the binary the final stage copies is statically linked, runs
#    `--version`, and `install` copies it to a working binary; with root, it
#    also runs and resolves `localhost` inside an empty chroot (no libc, no
#    NSS modules: what a distroless or collector image gives it);
# 3. the final stage runs as a numeric non-root USER and its ENTRYPOINT is
#    the copied binary.
#
# Not proved: that the base images exist and that their toolchain matches
# this machine's (a mismatch with the rust:X.Y tag is reported).
#
# The release build reuses ${CARGO_TARGET_DIR:-target/image-check} (outside
# the temporary copy) so that repeated runs only rebuild leader-gate itself.
set -euo pipefail
started=$SECONDS
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dockerfile=$root/Dockerfile
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target/image-check}")

fail() {
    echo "check-image-build: $*" >&2
    exit 1
}
say() { echo "check-image-build: $*"; }

# --- parse the Dockerfile into one instruction per line ---------------------
# Comment lines go (also inside a continuation), continuations are joined.
mapfile -t lines < <(awk '
    /^[[:space:]]*#/ { next }
    /^[[:space:]]*$/ { next }
    {
        line = $0; sub(/[[:space:]]+$/, "", line)
        if (line ~ /\\$/) { buf = buf substr(line, 1, length(line) - 1); next }
        print buf line; buf = ""
    }
    END { if (buf != "") print buf }
' "$dockerfile")

# stage_of[i]: the stage of line i (-1 before the first FROM); names[s]: the
# stage's alias (or its index).
declare -a stage_of names
stage=-1
for i in "${!lines[@]}"; do
    read -r instr rest <<<"${lines[$i]}"
    if [[ ${instr^^} == FROM ]]; then
        stage=$((stage + 1))
        read -r _image as alias <<<"$rest"
        if [[ ${as^^} == AS && -n $alias ]]; then names[stage]=$alias; else names[stage]=$stage; fi
    fi
    stage_of[i]=$stage
done
((stage >= 1)) || fail "expected a build stage and a final stage in $dockerfile"
final=$stage

# KEY=VALUE (VALUE optionally double-quoted) -> sets kv_key, kv_value.
split_kv() {
    [[ $1 =~ ^([A-Za-z_][A-Za-z0-9_]*)=(\"([^\"]*)\"|([^[:space:]\"]*))$ ]] ||
        fail "unsupported form (want one KEY=VALUE): $2 $1"
    kv_key=${BASH_REMATCH[1]}
    kv_value=${BASH_REMATCH[3]}${BASH_REMATCH[4]}
}

# ARGs declared before the first FROM, with their defaults.
declare -A global_args=()
for i in "${!lines[@]}"; do
    ((stage_of[i] == -1)) || continue
    read -r instr rest <<<"${lines[$i]}"
    [[ ${instr^^} == ARG ]] || continue
    if [[ $rest == *=* ]]; then
        split_kv "$rest" ARG
        global_args[$kv_key]=$kv_value
    else
        global_args[$rest]=""
    fi
done

# Expands $VAR and ${VAR} from the associative array named by $2.
expand() {
    local -n vars=$2
    local text=$1 name
    for name in "${!vars[@]}"; do
        text=${text//\$\{$name\}/${vars[$name]}}
        text=${text//\$$name/${vars[$name]}}
    done
    printf '%s' "$text"
}

# --- the final stage ---------------------------------------------------------
user="" entrypoint="" copy_from="" copy_src="" copy_dest=""
declare -A final_vars=()
for i in "${!lines[@]}"; do
    ((stage_of[i] == final)) || continue
    read -r instr rest <<<"${lines[$i]}"
    case ${instr^^} in
    FROM) say "final stage: FROM $rest" ;;
    ARG)
        if [[ $rest == *=* ]]; then
            split_kv "$rest" ARG
            final_vars[$kv_key]=$kv_value
        else
            final_vars[$rest]=${global_args[$rest]-}
        fi
        ;;
    USER) user=$rest ;;
    ENTRYPOINT) entrypoint=$rest ;;
    COPY)
        read -r -a words <<<"$rest"
        if [[ ${words[0]} == --from=* ]]; then
            [[ -z $copy_from ]] || fail "more than one COPY --from in the final stage"
            ((${#words[@]} == 3)) || fail "want COPY --from=STAGE SRC DEST: COPY $rest"
            copy_from=${words[0]#--from=}
            copy_src=$(expand "${words[1]}" final_vars)
            copy_dest=${words[2]}
        fi
        ;;
    esac
done

[[ $user =~ ^([0-9]+)(:([0-9]+))?$ ]] ||
    fail "the final stage's USER must be numeric (uid[:gid]) for runAsNonRoot; got '${user:-<none>}'"
((BASH_REMATCH[1] != 0)) || fail "the final stage's USER must not be root (uid 0)"
say "final stage: USER $user (numeric, non-root)"
[[ -n $copy_from ]] || fail "the final stage copies nothing from a build stage"
[[ $entrypoint == "[\"$copy_dest\""* ]] ||
    fail "ENTRYPOINT ($entrypoint) does not start the copied binary $copy_dest"

build=""
for s in "${!names[@]}"; do [[ ${names[s]} == "$copy_from" ]] && build=$s; done
[[ -n $build ]] || fail "COPY --from=$copy_from: no such stage"

# --- replay the build stage in a clean directory ----------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/image-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/ctx"

# What `docker build` would have in its environment, and nothing of ours.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_TARGET CARGO_BUILD_RUSTFLAGS \
    CARGO_PROFILE_RELEASE_LTO CARGO_PROFILE_RELEASE_CODEGEN_UNITS
declare -A build_vars=()
ignored=()
if [[ -f .dockerignore ]]; then
    while IFS= read -r pattern; do
        pattern=${pattern%%#*}
        pattern=${pattern%"${pattern##*[![:space:]]}"}
        [[ -n $pattern && $pattern != !* ]] && ignored+=("${pattern%/}")
    done <.dockerignore
fi
workdir=""
replayed_cargo=0
for i in "${!lines[@]}"; do
    ((stage_of[i] == build)) || continue
    read -r instr rest <<<"${lines[$i]}"
    case ${instr^^} in
    FROM)
        say "build stage: FROM $rest"
        if [[ $rest =~ ^rust:([0-9]+\.[0-9]+) ]]; then
            [[ "$(rustc --version)" == "rustc ${BASH_REMATCH[1]}."* ]] ||
                say "WARNING: the image uses rust:${BASH_REMATCH[1]}, this machine has $(rustc --version)"
        fi
        ;;
    ARG)
        if [[ $rest == *=* ]]; then
            split_kv "$rest" ARG
            build_vars[$kv_key]=$kv_value
        else
            build_vars[$rest]=${global_args[$rest]-}
        fi
        ;;
    ENV)
        split_kv "$rest" ENV
        build_vars[$kv_key]=$(expand "$kv_value" build_vars)
        ;;
    WORKDIR)
        [[ $rest == /* ]] || fail "WORKDIR must be absolute: $rest"
        [[ -z $workdir ]] || fail "only one WORKDIR is supported in the build stage"
        workdir=$rest
        ;;
    COPY)
        [[ -n $workdir ]] || fail "COPY before WORKDIR"
        read -r -a words <<<"$rest"
        [[ ${words[0]} != --* ]] || fail "COPY flags are not supported in the build stage: COPY $rest"
        ((${#words[@]} >= 2)) || fail "COPY needs a source and a destination: COPY $rest"
        dest=${words[-1]}
        srcs=("${words[@]:0:${#words[@]}-1}")
        [[ $dest == /* ]] && { [[ $dest == "$workdir"/* || $dest == "$workdir" ]] ||
            fail "COPY destination outside WORKDIR: $dest"; dest=${dest#"$workdir"}; dest=${dest#/}; }
        into=$work/ctx/$dest
        for src in "${srcs[@]}"; do
            [[ $src != *[\*\?\[]* ]] || fail "COPY globs are not supported: $src"
            [[ -e $src ]] || fail "COPY $src: no such file in the repository"
            for pattern in "${ignored[@]}"; do
                # shellcheck disable=SC2053 # the pattern is a glob on purpose
                [[ $src == $pattern || $src == $pattern/* ]] &&
                    fail "COPY $src: excluded from the build context by .dockerignore ($pattern)"
            done
            if [[ -d $src ]]; then
                mkdir -p "$into"
                cp -a "$src/." "$into/"
            elif [[ $dest == */ || ${#srcs[@]} -gt 1 ]]; then
                mkdir -p "$into"
                cp -p "$src" "$into/"
            else
                mkdir -p "$(dirname "$into")"
                cp -p "$src" "$into"
            fi
            say "COPY $src -> ${workdir%/}/${dest#./}"
        done
        ;;
    RUN)
        [[ -n $workdir ]] || fail "RUN before WORKDIR"
        [[ $rest != \[* ]] || fail "exec-form RUN is not supported: RUN $rest"
        [[ $rest == *cargo* ]] && replayed_cargo=1
        say "RUN $rest"
        (
            cd "$work/ctx"
            for name in "${!build_vars[@]}"; do export "$name=${build_vars[$name]}"; done
            export CARGO_TARGET_DIR=$target_dir
            /bin/sh -c "$rest"
        ) || fail "the build stage's RUN failed: $rest"
        ;;
    USER | SHELL | ONBUILD | VOLUME | ADD)
        fail "$instr in the build stage is not supported by this check"
        ;;
    esac
done
((replayed_cargo)) || fail "the build stage runs no cargo command"
[[ -z ${build_vars[CARGO_TARGET_DIR]-} ]] || fail "the build stage must not set CARGO_TARGET_DIR"

# The final stage copies $workdir/target/<path>; here that is $target_dir/<path>.
[[ $copy_src == "${workdir%/}/target/"* ]] ||
    fail "the final stage copies $copy_src, not a file under ${workdir%/}/target/"
binary=$target_dir/${copy_src#"${workdir%/}/target/"}
[[ -x $binary ]] || fail "the build stage produced no $copy_src"

# --- the binary --------------------------------------------------------------
command -v file >/dev/null || fail "needs file(1)"
description=$(file -L "$binary")
say "$description"
[[ $description == *"statically linked"* || $description == *"static-pie linked"* ]] ||
    fail "the binary is not statically linked"
[[ $description != *interpreter* ]] || fail "the binary asks for a dynamic loader"
linkage=$(ldd "$binary" 2>&1 || true)
[[ $linkage == *"not a dynamic executable"* || $linkage == *"statically linked"* ]] ||
    fail "ldd lists shared libraries: $linkage"
say "ldd: $(echo "$linkage" | head -n1 | sed 's/^[[:space:]]*//')"
say "size: $(stat -c %s "$binary") bytes"

package_version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
version=$("$binary" --version)
[[ $version == "leader-gate $package_version" ]] ||
    fail "--version printed '$version', want 'leader-gate $package_version'"
say "--version: $version"

mkdir "$work/gate"
"$binary" install "$work/gate/leader-gate" || fail "install failed"
cmp -s "$binary" "$work/gate/leader-gate" || fail "install's copy differs from the binary"
[[ "$("$work/gate/leader-gate" --version)" == "$version" ]] || fail "the installed copy does not run"
say "install: the copy runs (--version: $version)"

# Run it where there is no libc and no NSS module, only the files a
# distroless base and the kubelet provide, and check that a host name still
# resolves: `status` against a closed port on `localhost` must get as far as
# "connection refused", not fail the lookup.
if [[ $(id -u) == 0 ]] && command -v chroot >/dev/null && chroot / true 2>/dev/null; then
    jail=$work/jail
    mkdir -p "$jail/etc" "$jail/bin"
    cp "$binary" "$jail/bin/leader-gate"
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n' >"$jail/etc/hosts"
    printf 'hosts: files dns\n' >"$jail/etc/nsswitch.conf"
    [[ "$(chroot "$jail" /bin/leader-gate --version)" == "$version" ]] ||
        fail "the binary does not run in an empty root"
    port=$(
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
            echo 1
    )
    set +e
    out=$(chroot "$jail" /bin/leader-gate status --url "http://localhost:$port" 2>&1)
    rc=$?
    set -e
    [[ $rc == 2 && $out == *"refused"* ]] ||
        fail "in an empty root, status against http://localhost:$port: exit $rc, '$out' (want 2 and 'connection refused')"
    say "empty root: runs, and resolves localhost through /etc/hosts ($out)"
else
    say "not root (or no chroot): skipped the empty-root run"
fi

say "ok in $((SECONDS - started)) s"
