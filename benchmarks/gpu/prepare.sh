#!/usr/bin/env bash
# Builds the GPU kit's wheel folder from wheels.txt, on a machine with a network and a Rust
# toolchain: the enginekit wheel (maturin, one cp311-abi3 wheel for every CPython >= 3.11),
# the enginekit-plugins wheel, and the pinned pure-Python wheels (pip wheel --no-deps:
# downloaded, or built from the sdist where PyPI has no wheel, as for antlr4 4.9.3).
#
#   benchmarks/gpu/prepare.sh [--dry-run] [DIR]     (DIR defaults to benchmarks/gpu/wheels)
#
# --dry-run prints the commands and runs none. The folder is emptied of wheels first, so it
# ends holding exactly one wheel per build and fetch entry (checked at the end).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
DEST=$(mkdir -p "${1:-$HERE/wheels}" && cd "${1:-$HERE/wheels}" && pwd)

run() {
  echo "+ $*"
  if [ "$DRY" = 0 ]; then "$@"; fi
}

# "kind requirement" pairs of wheels.txt, comments and blank lines dropped.
entries() { sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$HERE/wheels.txt"; }

if [ "$DRY" = 0 ]; then rm -f "$DEST"/*.whl; fi
expected=()
while read -r kind req; do
  case "$kind" in
    build)
      case "$req" in
        enginekit) run bash -c "cd '$ROOT' && maturin build --release --out '$DEST'" ;;
        enginekit-plugins) run "$PY" -m pip wheel --no-deps --no-build-isolation -w "$DEST" "$ROOT/plugins" ;;
        *) echo "prepare: no build rule for $req" >&2; exit 1 ;;
      esac
      expected+=("$req") ;;
    fetch)
      run "$PY" -m pip wheel --no-deps -w "$DEST" "$req"
      expected+=("${req%%==*}") ;;
    image) ;;
    *) echo "prepare: unknown kind '$kind' in wheels.txt" >&2; exit 1 ;;
  esac
done < <(entries)

if [ "$DRY" = 1 ]; then exit 0; fi
# One wheel per entry: wheel file names spell the project name with '_' for '-' and '.'.
status=0
for name in "${expected[@]}"; do
  stem=$(echo "$name" | tr '.-' '__')
  count=$(find "$DEST" -maxdepth 1 -iname "${stem}-*.whl" | wc -l)
  if [ "$count" != 1 ]; then echo "prepare: $count wheels for $name in $DEST" >&2; status=1; fi
done
ls -l "$DEST"/*.whl
du -sh "$DEST"
exit $status
