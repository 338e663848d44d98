#!/usr/bin/env bash
# Every relative link in README.md and docs/*.md resolves: the file exists
# and, for `file#anchor` or `#anchor`, a heading of that file has that
# anchor (GitHub's rule: lower case, punctuation dropped, spaces to hyphens,
# repeats numbered -1, -2, ...). Code blocks and inline code are skipped.
# Run by .ci/run; needs only python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - README.md docs/*.md <<'PY'
import os, re, sys

def slugs(path):
    seen, out, fence = {}, set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        if fence or not re.match(r"#{1,6} ", line):
            continue
        text = line.lstrip("#").strip()
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out

bad = 0
for doc in sys.argv[1:]:
    fence = False
    for number, line in enumerate(open(doc, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(file):
                print(f"{doc}:{number}: {target}: no such file {file}", file=sys.stderr)
                bad += 1
            elif anchor and (not file.endswith(".md") or anchor not in slugs(file)):
                print(f"{doc}:{number}: {target}: no heading #{anchor} in {file}", file=sys.stderr)
                bad += 1
if bad:
    sys.exit(f"check-docs: {bad} broken link(s)")
print(f"check-docs: every relative link in {len(sys.argv) - 1} files resolves")
PY
