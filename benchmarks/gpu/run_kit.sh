#!/usr/bin/env bash
# The GPU kit: everything enginekit checks and measures on a CUDA GPU, in one command, on a
# machine with no network whose Python already has torch, triton and transformers.
#
#   benchmarks/gpu/run_kit.sh [--install-only]
#
# Steps (each one's output also goes to RESULTS/<step>.log, its figures to RESULTS/*.json):
#   install   pip install --no-index --find-links WHEELS the build and fetch entries of
#             wheels.txt (the folder prepare.sh builds), into the running environment
#             (or, without their dependencies, into KIT_TARGET, then put on PYTHONPATH);
#             then checks that enginekit is imported from the installed wheel, not from
#             this source tree, and that the plugins' entry points resolve;
#   cases     benchmarks/gpu/native_cases.py: tests/kernel_cases.py's cases compiled and
#             run on the GPU, at their own shapes and at real ones;
#   kernels   benchmarks/bench_kernels.py (KIT_BENCH_ARGS, default --quick): the attention
#             kernels beside torch's SDPA;
#   e2e       benchmarks/gpu/e2e.py (KIT_E2E_ARGS): a random-weight Llama-3-8B-shaped
#             model through enginekit and transformers, the simulator's step times beside;
#   proxies   only with KIT_PROXIES=1: tools/kernel_proxies.py --ci on this machine's
#             Triton.
# Each step has a time limit (KIT_*_TIMEOUT seconds) that keeps the whole kit under 8
# minutes; a failed step does not stop the next. Environment: KIT_WHEELS (default
# benchmarks/gpu/wheels), KIT_RESULTS (default ./kit-results), PYTHON (default python3).
# Exit status: 2 without a CUDA GPU (checked first), 3 if the install fails, 1 if a step
# failed, 0 otherwise.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
WHEELS=${KIT_WHEELS:-$HERE/wheels}
RESULTS=${KIT_RESULTS:-$PWD/kit-results}
INSTALL_ONLY=0
if [ "${1:-}" = "--install-only" ]; then INSTALL_ONLY=1; fi

if [ "$INSTALL_ONLY" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  echo "run_kit: needs a CUDA GPU; torch.cuda.is_available() is False on this machine (or $PY has no torch)" >&2
  exit 2
fi
mkdir -p "$RESULTS"
unset PYTHONPATH TRITON_INTERPRET
start_all=$(date +%s)
summary=()
failed=0

# The build and fetch entries of wheels.txt, as pip requirements.
requirements() { sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$HERE/wheels.txt" | awk '$1 == "build" || $1 == "fetch" { print $2 }'; }

step() {  # step NAME TIMEOUT COMMAND...
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  echo "== $name (limit ${limit} s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$RESULTS/$name.log"
  rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-8s rc %-3s %4d s' "$name" "$rc" $(( $(date +%s) - t0 )))")
  if [ "$rc" != 0 ]; then failed=1; fi
  echo "== $name: rc $rc in $(( $(date +%s) - t0 )) s"
}

install() {
  local args=(--no-index --find-links "$WHEELS" --no-cache-dir --disable-pip-version-check)
  if [ -n "${KIT_TARGET:-}" ]; then
    # A target folder sees nothing installed: every entry, none of the image's packages.
    # shellcheck disable=SC2046
    "$PY" -m pip install "${args[@]}" --target "$KIT_TARGET" --upgrade --no-deps \
      $(requirements) || return 1
    export PYTHONPATH="$KIT_TARGET"
  else
    # shellcheck disable=SC2046
    "$PY" -m pip install "${args[@]}" $(requirements) || return 1
    # This repository's wheels again, whatever was installed under the same version before.
    # shellcheck disable=SC2046
    "$PY" -m pip install "${args[@]}" --force-reinstall --no-deps \
      $(requirements | grep -v '==') || return 1
  fi
  (cd / && "$PY" - "$ROOT" <<'PY'
import sys, importlib.metadata as md
import enginekit, enginekit._native
from enginekit.plugins import plugin_names
root = sys.argv[1]
if "paged" not in plugin_names("allocator"):
    sys.exit("enginekit-plugins' entry points are not registered")
if enginekit.__file__.startswith(root):
    sys.exit(f"enginekit was imported from the source tree ({enginekit.__file__})")
print(f"enginekit {md.version('enginekit')} from {enginekit.__file__}; native "
      f"{enginekit._native.__file__.rsplit('/', 1)[-1]}; plugins "
      f"{md.version('enginekit-plugins')}; hydra-core {md.version('hydra-core')}")
PY
  )
}

echo "== install from $WHEELS"
t0=$(date +%s)
if ! install 2>&1 | tee "$RESULTS/install.log"; then
  echo "run_kit: the offline install failed (see $RESULTS/install.log)" >&2
  exit 3
fi
summary+=("$(printf '%-8s rc %-3s %4d s' install 0 $(( $(date +%s) - t0 )))")
if [ -n "${KIT_TARGET:-}" ]; then export PYTHONPATH="$KIT_TARGET"; fi
if [ "$INSTALL_ONLY" = 1 ]; then exit 0; fi

"$PY" -c 'import torch, triton, transformers; print(f"{torch.cuda.get_device_name(0)}: torch {torch.__version__}, triton {triton.__version__}, transformers {transformers.__version__}")'
step cases "${KIT_CASES_TIMEOUT:-150}" "$PY" "$ROOT/benchmarks/gpu/native_cases.py" \
  --json "$RESULTS/native_cases.json"
# shellcheck disable=SC2086
step kernels "${KIT_KERNELS_TIMEOUT:-120}" "$PY" "$ROOT/benchmarks/bench_kernels.py" \
  ${KIT_BENCH_ARGS:---quick} --json "$RESULTS/bench_kernels.json"
# shellcheck disable=SC2086
step e2e "${KIT_E2E_TIMEOUT:-180}" "$PY" "$ROOT/benchmarks/gpu/e2e.py" ${KIT_E2E_ARGS:-} \
  --json "$RESULTS/e2e.json"
if [ "${KIT_PROXIES:-0}" = 1 ]; then
  step proxies "${KIT_PROXIES_TIMEOUT:-120}" "$PY" "$ROOT/tools/kernel_proxies.py" --ci \
    --jobs 12 --json "$RESULTS/kernel_proxies.json"
fi

echo "== kit summary ($(( $(date +%s) - start_all )) s; results in $RESULTS)"
printf '%s\n' "${summary[@]}"
exit $failed
