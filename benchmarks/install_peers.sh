#!/usr/bin/env bash
# The peers benchmarks/peers.py cannot share feedline's environment with: FFCV, NVIDIA DALI (CPU only) and
# Mosaic Streaming, each in an overlay folder of its own (`pip install --target`), which peers.py puts first on
# PYTHONPATH for that peer's processes only. Idempotent.
#   bash benchmarks/install_peers.sh [ffcv] [dali] [mosaic]      (default: all three)
#   FEEDLINE_PEERS_DIR=/some/dir bash benchmarks/install_peers.sh  (default: benchmarks/.peers; peers.py reads it too)
#   PY=/path/to/python bash benchmarks/install_peers.sh          (default: .venv/bin/python, else python)
# FFCV builds from source: it needs Debian's libturbojpeg0-dev, libopencv-dev and pkg-config (apt-get, as root).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PEERS_DIR="${FEEDLINE_PEERS_DIR:-$HERE/.peers}"
if [ -z "${PY:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python; fi
fi
PEERS=("$@"); [ ${#PEERS[@]} -eq 0 ] && PEERS=(ffcv dali mosaic)
mkdir -p "$PEERS_DIR"

pip_target() {  # pip_target DIR PACKAGE...: fresh install of exactly these packages (no dependency resolution)
  local dir="$1"; shift
  rm -rf "$dir.tmp"
  "$PY" -m pip install --quiet --no-deps --target "$dir.tmp" "$@" 2>&1 | grep -v "is ignored: it is neither" || true
  [ -d "$dir.tmp" ] || { echo "pip install into $dir.tmp failed" >&2; exit 1; }
  rm -rf "$dir.tmp/bin"
}

finish() {  # finish DIR: move the fresh overlay into place and mark it complete
  rm -rf "$1"; mv "$1.tmp" "$1"; touch "$1/.installed"
}

for peer in "${PEERS[@]}"; do
  dir="$PEERS_DIR/$peer"
  if [ -f "$dir/.installed" ]; then echo "== $peer: already installed in $dir"; continue; fi
  echo "== $peer: installing into $dir"
  case "$peer" in
    ffcv)
      # FFCV 1.0.2 is an sdist: its C++ extension links libturbojpeg and OpenCV, found with pkg-config.
      if ! dpkg -s libturbojpeg0-dev libopencv-dev pkg-config g++ >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libturbojpeg0-dev libopencv-dev pkg-config build-essential
      fi
      # numba 0.68.1 supports numpy < 2.6, so the venv's numpy 2.4.6 is used (no numpy in this overlay).
      # opencv-python-headless instead of ffcv's declared opencv-python (same cv2 module, no GUI libraries);
      # pytorch-pfn-extras is only imported by ffcv's NormalizeImage on CUDA.
      pip_target "$dir" ffcv==1.0.2 numba==0.68.1 llvmlite==0.50.0 opencv-python-headless==5.0.0.93 \
        terminaltables==3.1.10 fastargs==1.2.0 assertpy==1.1 pytorch-pfn-extras==0.9.0
      finish "$dir" ;;
    dali)
      # nvidia-dali-cuda130 2.4.0 from PyPI (no extra index needed) and its runtime deps, minus the ones the venv
      # already has at the same versions (numpy, packaging, six, pyyaml, typing-extensions).
      pip_target "$dir" nvidia-dali-cuda130==2.4.0 astunparse==1.6.3 gast==0.7.0 libcst==1.9.0 makefun==1.16.0 \
        nvtx==0.2.17 optree==0.20.0 nvidia-libnvcomp-cu13==5.3.0.16 nvidia-nvimgcodec-cu13==0.9.0.20 \
        nvidia-nvjpeg==13.3.2.43 nvidia-nvjpeg2k-cu13==0.11.0.51 nvidia-nvtiff-cu13==0.8.0.82
      # nvimgcodec/nvjpeg2k/nvtiff ship nvidia/__init__.py, which would turn `nvidia` into a regular package
      # and hide the venv's nvidia/* (torch's CUDA wheels); without it both merge as one namespace package.
      rm -rf "$dir.tmp/nvidia/__init__.py" "$dir.tmp/nvidia/__pycache__"
      finish "$dir" ;;
    mosaic)
      # mosaicml-streaming 0.13.0 pins numpy < 2.2: numpy 2.1.3 lives in this overlay and shadows the venv's
      # numpy in that process only. streaming imports transformers (BatchFeature) at import time, and
      # xxhash/zstd/snappy/brotli/catalogue; the cloud SDKs (boto3, azure, gcs, oci, paramiko) are only
      # imported for remote storage and are left out.
      pip_target "$dir" mosaicml-streaming==0.13.0 numpy==2.1.3 transformers==4.57.6 huggingface-hub==0.36.2 \
        tokenizers==0.22.2 safetensors==0.8.0 regex==2026.11.15 xxhash==3.8.2 zstd==1.5.7.2 \
        python-snappy==0.7.3 cramjam==2.14.0 Brotli==1.2.1 catalogue==2.0.10
      finish "$dir" ;;
    *) echo "unknown peer: $peer" >&2; exit 2 ;;
  esac
done
