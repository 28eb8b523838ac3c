#!/usr/bin/env bash
# The CUDA path validated in one call (README, "GPU check"): the GPU-marked tests, then a short
# `shardrec bench train --device cuda` in fp32 and bf16, one summary table last.
#
# Exit: 0 every check that could run passed (one GPU: "not run: needs 2 GPUs" rows); 1 a check
# failed; 3 no CUDA device was found (one line, nothing run or installed); 4 the carried wheels
# could not be joined, verified or installed; 5 torch cannot be imported (and no wheels are
# carried), or the stack is not the pinned one and SHARDREC_ALLOW_STACK does not name it (one line).
#
# Python: $PYTHON, else .venv/bin/python, else python3. On a machine without the pinned stack,
# GPU_CHECK_WHEELS names a folder of carried wheels (whole, or in pieces NAME.whl.part-NN with a
# NAME.whl.sha256 from sha256sum): they are joined, checked and installed with shardrec itself
# into GPU_CHECK_SITE (default /tmp/shardrec-gpu-site), which goes first on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi

# One import of torch (seconds) answers both questions: 0 a CUDA device is there, 1 torch imports
# but sees none, anything else torch cannot be imported.
torch_state() {
    "$PY" -c 'import sys
try:
    import torch
except BaseException:
    sys.exit(2)
sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() else 1)' 2>/dev/null
}

no_cuda_exit() {
    echo "gpu check: no CUDA device was found (torch.cuda.is_available() is False for $PY); nothing was run"
    exit 3
}

# Without torch there is no telling whether a device is there: said as such, not as "no CUDA".
state=0
torch_state || state=$?
if [ "$state" = 1 ]; then
    no_cuda_exit
elif [ "$state" != 0 ] && [ -z "${GPU_CHECK_WHEELS:-}" ]; then
    echo "gpu check: $PY cannot import torch: run make setup first (or name carried wheels in GPU_CHECK_WHEELS); nothing was run"
    exit 5
fi

if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
    site=${GPU_CHECK_SITE:-/tmp/shardrec-gpu-site}
    for sum in "$GPU_CHECK_WHEELS"/*.whl.sha256; do
        [ -e "$sum" ] || break
        wheel=${sum%.sha256}
        if [ ! -f "$wheel" ]; then
            # Pieces sort by their numbered suffix; written to a temp name, then renamed.
            cat "$wheel".part-* > "$wheel.joining" || { echo "gpu check: cannot join $wheel.part-*"; exit 4; }
            mv "$wheel.joining" "$wheel"
        fi
        (cd "$GPU_CHECK_WHEELS" && sha256sum --quiet -c "$(basename "$sum")") \
            || { echo "gpu check: $wheel does not match $sum"; exit 4; }
    done
    "$PY" -m pip install -q --no-deps --upgrade --target "$site" "$GPU_CHECK_WHEELS"/*.whl \
        || { echo "gpu check: installing the wheels in $GPU_CHECK_WHEELS failed"; exit 4; }
    "$PY" -m pip install -q --no-deps --no-build-isolation --upgrade --target "$site" . \
        || { echo "gpu check: installing shardrec into $site failed"; exit 4; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    torch_state || no_cuda_exit
fi

# The pinned stack only, unless the caller names one other triple in SHARDREC_ALLOW_STACK (the
# summary then says which ran): a check of another stack is not a check of shardrec's.
exec "$PY" -m shardrec.tools.bench.gpu_check
