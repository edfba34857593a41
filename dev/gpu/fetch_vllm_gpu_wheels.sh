#!/usr/bin/env bash
# Download vLLM 0.24.0 and the requirements the GPU image lacks for `vllm serve` of a plain
# decoder (flash-attention backend) and `vllm bench serve`, and cut them into pieces that
# each fit one device call. Python 3.12, manylinux x86-64, binary wheels only, --no-deps.
#
# Why pieces: the GPU machines have no package index, and a device call carries at most
# 64 MiB together with the working tree; the vLLM wheel alone is 279 MB. So the
# wheels are put in one tar, the tar is split into pieces of PIECE_BYTES, and each piece
# travels in its own call (dev/gpu/vllm_gpu_carry.sh says how; docs/serving.md has the
# steps). A user whose GPU node reaches a package index needs none of this:
# `pip install vllm==0.24.0` (docs/serving.md).
#
# Sets (the package lists and the reason for each package are in docs/serving.md):
#   minimal     (default) what the serve and bench processes were seen to import on the H200
#   candidates  the first guess it was found from: every runtime requirement of vllm 0.24.0
#               that the image lacks, minus the kernel packages of other backends
#
# Usage: dev/gpu/fetch_vllm_gpu_wheels.sh [minimal|candidates] [pip]
# Output: .vllm-whl/<set>/*.whl and .vllm-carry/p01 ... pNN (each: one piece + MANIFEST)
set -euo pipefail

SET="${1:-minimal}"
PIP="${2:-python3 -m pip}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
# A piece travels with the working tree (what git tracks, or the whole folder outside a git
# checkout), and a call carries 64 MiB in all: pieces fill what the tree leaves, less 4 MB for
# files added before the pieces travel, and at most 40 MB. PIECE_BYTES overrides the size.
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    TREE_BYTES=$(cd "$ROOT" && git ls-files -z | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
else
    TREE_BYTES=$(du -sb --exclude=.vllm-whl --exclude=.vllm-carry "$ROOT" | cut -f1)
    echo "fetch_vllm_gpu_wheels.sh: $ROOT is not a git checkout; sizing pieces by the whole folder ($TREE_BYTES bytes)" >&2
fi
ROOM=$(( 67108864 - TREE_BYTES - 4000000 ))
[ "$ROOM" -gt 40000000 ] && ROOM=40000000
if [ -n "${PIECE_BYTES:-}" ]; then
    [ "$PIECE_BYTES" -gt 0 ] 2>/dev/null || { echo "PIECE_BYTES must be a positive number of bytes, got '$PIECE_BYTES'" >&2; exit 2; }
else
    PIECE_BYTES=$ROOM
    [ "$PIECE_BYTES" -ge 8000000 ] || { echo "the working tree ($TREE_BYTES bytes) leaves under 8 MB of a 64 MiB call for a piece; set PIECE_BYTES or carry from a smaller tree" >&2; exit 1; }
fi
WHL="$ROOT/.vllm-whl/$SET"
CARRY="$ROOT/.vllm-carry"

# vLLM itself: its compiled extensions match the image's torch 2.11.0+cu130.
VLLM=(vllm==0.24.0)

# Found by trying on a lent H200 (2026-12-01): the distributions whose modules the API
# server, the engine core and `vllm bench serve` imported while the whole GPU serving suite
# ran (dev/gpu/vllm_import_trace.py over PYTHONPROFILEIMPORTTIME logs), then confirmed by a
# second run with these alone. docs/serving.md gives the reason for each.
MINIMAL=(
    fastapi==0.136.3 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34
    httptools==0.9.0 websockets==17.4 email-validator==2.4.0
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    pydantic-extra-types==2.11.1
    openai==3.57.0 httpx2==2.16.2 sniffio==1.3.1 openai-harmony==0.0.8
    prometheus-fastapi-instrumentator==8.1.0 pyzmq==27.3.0 msgspec==0.23.0
    cachetools==8.0.2 cbor2==6.3.0 pybase64==1.5.1 partial-json-parser==0.2.1.1.post7
    setproctitle==1.3.8 watchfiles==1.3.0 dill==0.4.1
    xgrammar==0.2.3 apache-tvm-ffi==0.1.9
    llguidance==1.6.1
    model-hosting-container-standards==0.1.16 jmespath==1.1.0
    opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
    opentelemetry-proto==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
    googleapis-common-protos==1.76.0
)

# The first guess: MINIMAL plus the runtime requirements of vllm 0.24.0 (and theirs) that no
# process imported in the trial; flashinfer, cutlass-dsl, tilelang and the other kernel
# packages of other backends were left out from the start (see VLLM_USE_FLASHINFER_SAMPLER).
CANDIDATES=(
    "${MINIMAL[@]}"
    anthropic==2.14.0 docstring-parser==0.18.0 httpcore2==2.16.2 jiter==0.19.0
    blake3==1.0.11 ijson==3.6.0 python-json-logger==4.2.0 diskcache==5.6.3 lark==1.2.2
    lm-format-enforcer==0.11.3 interegular==0.3.3 outlines-core==0.2.14
    mistral-common==1.13.1 pycountry==26.2.16 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
    referencing==0.37.0 rpds-py==2026.9.1 compressed-tensors==0.17.0 loguru==0.7.3
    depyf==0.20.0 astor==0.8.1 supervisor==4.3.0
    mcp==2.3.0 mcp-types==2.3.0 sse-starlette==3.7.0 pydantic-settings==2.16.3 python-dotenv==1.2.4
    pyjwt==2.15.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 dnspython==2.9.2
    opentelemetry-semantic-conventions-ai==0.5.1 opentelemetry-exporter-otlp==1.45.2
    opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2
    opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-http-transport==0.66b2
)

case "$SET" in
    minimal) PKGS=("${VLLM[@]}" "${MINIMAL[@]}") ;;
    candidates) PKGS=("${VLLM[@]}" "${CANDIDATES[@]}") ;;
    *) echo "fetch_vllm_gpu_wheels.sh: unknown set '$SET'; use minimal or candidates" >&2; exit 2 ;;
esac

# The wheels and pieces must never be committed: keep them out of git (local exclude).
EXCLUDE="$ROOT/.git/info/exclude"
if [ -d "$ROOT/.git" ]; then
    mkdir -p "$(dirname "$EXCLUDE")"
    for p in /.vllm-whl/ /.vllm-carry/; do grep -qx "$p" "$EXCLUDE" 2>/dev/null || echo "$p" >> "$EXCLUDE"; done
fi

mkdir -p "$WHL"
# Duplicates in one --target install stop it, so each set folder holds exactly its list.
$PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$WHL" "${PKGS[@]}"
want=$(printf '%s\n' "${PKGS[@]}" | sed 's/==.*//; s/[-_.]\+/_/g' | tr A-Z a-z | sort)
for f in "$WHL"/*.whl; do
    name=$(basename "$f" | cut -d- -f1 | sed 's/[-_.]\+/_/g' | tr A-Z a-z)
    grep -qx "$name" <<<"$want" || { echo "removing $(basename "$f"): not in the $SET set"; rm -f "$f"; }
done
n=$(ls "$WHL"/*.whl | wc -l)
[ "$n" -eq "${#PKGS[@]}" ] || { echo "expected ${#PKGS[@]} wheels in $WHL, found $n" >&2; exit 1; }

# One tar, cut into pieces; MANIFEST (in every piece folder) holds the tar's SHA256.
rm -rf "$CARRY"
mkdir -p "$CARRY/tmp"
tar -C "$WHL" --sort=name -cf "$CARRY/tmp/wheels.tar" .
sum=$(sha256sum "$CARRY/tmp/wheels.tar" | cut -d' ' -f1)
split -b "$PIECE_BYTES" -d -a 2 "$CARRY/tmp/wheels.tar" "$CARRY/tmp/wheels.tar.part"
pieces=$(ls "$CARRY"/tmp/wheels.tar.part* | wc -l)
i=0
for part in "$CARRY"/tmp/wheels.tar.part*; do
    i=$((i + 1))
    dir="$CARRY/$(printf 'p%02d' "$i")"
    mkdir -p "$dir"
    mv "$part" "$dir/"
    printf 'set=%s\nsha256=%s\npieces=%s\nbytes=%s\n' "$SET" "$sum" "$pieces" \
        "$(stat -c %s "$CARRY/tmp/wheels.tar")" > "$dir/MANIFEST"
done
rm -rf "$CARRY/tmp"
echo "$n wheels ($SET set), $(du -sh "$WHL" | cut -f1); tar sha256 $sum; $pieces pieces:"
du -sh "$CARRY"/p*
