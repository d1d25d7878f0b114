#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (as root) or a developer's checkout:
#   bash scripts/dev.sh demo   install, build, and serve the demo model on 127.0.0.1:8000
#   bash scripts/dev.sh test   install, build, and run every test (plus the sanitizer build)
#   bash scripts/dev.sh build  install and build only
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libpcre2-dev libfmt-dev libspdlog-dev
  zlib1g-dev libyaml-cpp-dev libutf8proc-dev libsqlite3-dev)
JOBS=${JOBS:-$(nproc)}

install_packages() {
  local missing=()
  for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
      echo "error: packages missing and not root: ${missing[*]}" >&2
      exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

build() {  # build DIR [cmake args...]
  local dir=$1
  shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

case "${1:-}" in
  build)
    install_packages
    build build
    ;;
  demo)
    install_packages
    build build
    # A 24M-parameter gpt-oss trained on man pages, shipped in the repo (models/demo/README.md).
    echo "serving the demo model on http://127.0.0.1:${PORT:-8000}/v1 (Ctrl-C stops it)"
    exec ./build/anvil serve models/demo --served-model-name demo --port "${PORT:-8000}"
    ;;
  test)
    install_packages
    # Where nvcc exists (CI has one, no GPU), the CUDA backend is compiled for Hopper and
    # workstation Blackwell so neither can rot; its GPU tests skip without a GPU.
    build build -DANVIL_CUDA_TARGETS="sm_90a;sm_120a"
    (cd build && ctest --output-on-failure -j "$JOBS")
    # The unit and model/engine suites again under AddressSanitizer and UndefinedBehaviorSanitizer
    # (the end-to-end server and CLI suites run in the Release build only: they time real
    # processes, which the sanitizers slow several-fold).
    cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANVIL_SANITIZE=ON -DANVIL_BUILD_BENCH=OFF \
      -DANVIL_CUDA=OFF >/dev/null
    cmake --build build-sanitize -j "$JOBS" --target anvil_unit_tests anvil_model_tests
    export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
    ./build-sanitize/tests/anvil_unit_tests
    ./build-sanitize/tests/anvil_model_tests
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test|build" >&2
    exit 2
    ;;
esac
