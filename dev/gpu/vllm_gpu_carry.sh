#!/usr/bin/env bash
# Carry the pieces made by dev/gpu/fetch_vllm_gpu_wheels.sh to a GPU machine with no package
# index, join them, check the SHA256 and install with pip --no-index --no-deps --target.
#
# Each device call carries one piece folder and copies it to /tmp/vllm-carry on the machine
# (a later call's carry replaces the carried folder in the working tree, but /tmp stays while
# the machine is warm: make the calls back to back, within its 30 s). The call that carries
# the last piece installs:
#   run(carry=[".vllm-carry/p01"], command="dev/gpu/vllm_gpu_carry.sh stash .vllm-carry/p01")
#   ...
#   run(carry=[".vllm-carry/pNN"], command="dev/gpu/vllm_gpu_carry.sh stash .vllm-carry/pNN &&
#        dev/gpu/vllm_gpu_carry.sh install /tmp/site && export PYTHONPATH=/tmp/site && ...")
#
# Usage: vllm_gpu_carry.sh stash PIECE_DIR
#        vllm_gpu_carry.sh install TARGET [DIST_LIST]   (DIST_LIST: file of distribution names,
#                                                      one a line: install only those and vllm)
set -euo pipefail
STORE="${VLLM_CARRY_STORE:-/tmp/vllm-carry}"

case "${1:-}" in
stash)
    src="${2:?usage: vllm_gpu_carry.sh stash PIECE_DIR}"
    mkdir -p "$STORE"
    cp "$src"/wheels.tar.part* "$STORE"/
    cp "$src/MANIFEST" "$STORE/MANIFEST"
    echo "stashed $(ls "$src" | grep part) in $STORE: $(ls "$STORE" | grep -c part) of $(sed -n 's/^pieces=//p' "$STORE/MANIFEST") pieces"
    ;;
install)
    target="${2:?usage: vllm_gpu_carry.sh install TARGET [DIST_LIST]}"
    list="${3:-}"
    want=$(sed -n 's/^pieces=//p' "$STORE/MANIFEST")
    have=$(ls "$STORE" | grep -c 'wheels.tar.part' || true)
    [ "$have" -eq "$want" ] || { echo "have $have of $want pieces in $STORE: carry the missing ones (the machine went back?)" >&2; exit 1; }
    if [ ! -d "$STORE/whl" ]; then
        cat "$STORE"/wheels.tar.part* > "$STORE/wheels.tar"
        sum=$(sha256sum "$STORE/wheels.tar" | cut -d' ' -f1)
        expect=$(sed -n 's/^sha256=//p' "$STORE/MANIFEST")
        [ "$sum" = "$expect" ] || { echo "SHA256 mismatch: joined $sum, MANIFEST $expect; re-carry the pieces" >&2; exit 1; }
        echo "joined $want pieces, SHA256 $sum ok"
        mkdir -p "$STORE/whl"
        tar -C "$STORE/whl" -xf "$STORE/wheels.tar"
        rm -f "$STORE/wheels.tar"
    fi
    wheels=("$STORE"/whl/*.whl)
    if [ -n "$list" ]; then
        wheels=()
        for f in "$STORE"/whl/*.whl; do
            name=$(basename "$f" | cut -d- -f1 | sed 's/[-_.]\+/_/g' | tr A-Z a-z)
            if [ "$name" = vllm ] || sed 's/[-_.]\+/_/g' "$list" | tr A-Z a-z | grep -qx "$name"; then wheels+=("$f"); fi
        done
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "${wheels[@]}"
    echo "installed ${#wheels[@]} wheels into $target"
    ;;
*)
    echo "usage: vllm_gpu_carry.sh stash PIECE_DIR | install TARGET [DIST_LIST]" >&2; exit 2 ;;
esac
