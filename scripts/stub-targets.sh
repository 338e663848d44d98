#!/bin/sh
# Used by the Dockerfile: creates an empty stand-in for every Cargo target
# whose source file is missing (the crate's main.rs and lib.rs, and each
# [[bin]], [[bench]], [[example]], [[test]] Cargo.toml declares), so that
# cargo accepts a manifest whose sources were not copied. It prints the
# files it created, one per line.
#
# The dependency layer runs it on the bare manifests (everything is a stub,
# so only dependencies are really compiled); the build layer runs it after
# copying src/, where only targets the image does not build (the failover
# bench, any example) are still missing.
set -eu
manifest=${1:-Cargo.toml}
awk '
    function flush() {
        if (kind == "bin" && name != "") print (path != "" ? path : "src/bin/" name ".rs")
        else if (kind == "bench" && name != "") print (path != "" ? path : "benches/" name ".rs")
        else if (kind == "example" && name != "") print (path != "" ? path : "examples/" name ".rs")
        else if (kind == "test" && name != "") print (path != "" ? path : "tests/" name ".rs")
        else if (kind == "lib" && path != "") print path
        kind = ""; name = ""; path = ""
    }
    /^[[:space:]]*\[/ {
        flush()
        line = $0; gsub(/[[:space:]]/, "", line)
        if (line ~ /^\[\[(bin|bench|example|test)\]\]/) { kind = line; gsub(/[][]/, "", kind) }
        else if (line ~ /^\[lib\]/) kind = "lib"
        next
    }
    kind != "" && /^[[:space:]]*(name|path)[[:space:]]*=/ {
        key = $0; sub(/^[[:space:]]*/, "", key); sub(/[[:space:]]*=.*/, "", key)
        value = $0; sub(/^[^=]*=[[:space:]]*"/, "", value); sub(/".*/, "", value)
        if (key == "name") name = value; else path = value
    }
    END { flush() }
' "$manifest" | {
    cat
    echo src/main.rs
    echo src/lib.rs
} | while IFS= read -r file; do
    [ -e "$file" ] && continue
    mkdir -p "$(dirname "$file")"
    case "$file" in
        */lib.rs) : >"$file" ;;
        *) echo 'fn main() {}' >"$file" ;;
    esac
    echo "$file"
done
