#!/usr/bin/env bash
# One-time, idempotent set-up: Debian packages for the C++ build and a pinned .venv.
# Quiet when everything is present; prints progress when it installs.
set -euo pipefail
cd "$(dirname "$0")/.."

# clang + libclang-rt-14-dev (libFuzzer, sanitizer runtimes): make test-sanitize / make fuzz.
APT_PACKAGES=(g++ make cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libgtest-dev
  libcli11-dev clang-format util-linux clang libclang-rt-14-dev libcpp-httplib-dev libedit-dev tmux
  ccache libicu-dev)
PYTHON=${PYTHON:-python3}
STAMP=.bootstrap-stamp
# The venv's key: what goes into it (the pins and the interpreter), not this script.
want_stamp="$({ cat requirements.txt; "$PYTHON" --version; } | sha256sum | cut -c1-16)"

missing_apt=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing_apt+=("$p")
done
if ((${#missing_apt[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "[bootstrap] installing Debian packages: ${missing_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_apt[@]}" >/dev/null
  else
    echo "[bootstrap] missing Debian packages; run as root: apt-get install ${missing_apt[*]}" >&2
    exit 1
  fi
fi

# Caches outside the clone, keyed by content (a new machine just misses them): the venv per
# requirements hash, and the model store. .venv and models are links to them unless they
# already exist as directories (or EDGELLM_MODELS names another store).
CACHE=${EDGELLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgellm}
mkdir -p "$CACHE"
venv_dir="$CACHE/venv-$want_stamp"
if [[ -L .venv && "$(readlink .venv)" != "$venv_dir" ]]; then rm .venv; fi
[[ -e .venv ]] || ln -s "$venv_dir" .venv
if [[ -z "${EDGELLM_MODELS:-}" && ! -e models ]]; then
  mkdir -p "$CACHE/models"
  ln -s "$CACHE/models" models
fi
# A complete venv carries its own stamp, so every clone that links it skips the install.
if [[ -x .venv/bin/python && -f .venv/$STAMP && "$(cat .venv/$STAMP)" == "$want_stamp" ]]; then
  exit 0
fi
if [[ ! -x .venv/bin/python ]]; then
  echo "[bootstrap] creating the venv ($($PYTHON --version)) in $(readlink -f .venv)"
  "$PYTHON" -m venv "$(readlink -f .venv 2>/dev/null || echo .venv)"
fi
echo "[bootstrap] installing pinned Python packages (requirements.txt)"
# pip's exit status decides (pipefail), not the filter's: a failed install stops here.
if ! .venv/bin/pip install --disable-pip-version-check -q -r requirements.txt 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }; then
  echo "[bootstrap] pip install -r requirements.txt failed" >&2
  exit 1
fi
.venv/bin/python -c "import torch, transformers, tokenizers, safetensors, gguf, nanobind, ray, openai" \
  || { echo "[bootstrap] Python packages failed to import" >&2; exit 1; }
echo "$want_stamp" > .venv/$STAMP
echo "[bootstrap] done"
