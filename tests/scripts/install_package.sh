# shellcheck shell=bash
# Sourced by the install tests (install_example_test.sh, install_mnist_test.sh).

# install_test_arguments NAME "$@": the tests' two arguments, BUILD_DIR and SOURCE_DIR, as
# build_dir and source_dir; data_dir and python from the environment; tmp, a scratch folder named
# after NAME that is removed on exit. It lies in the build directory, at the same path in every
# run (the install tests hold its lock, so no two share it): where CI's compiler cache is on
# (scripts/lib/ccache.sh), a later run in a fresh clone is then served the programs built against
# the package, as every path of their compilations is inside the tree and written relative.
# shellcheck disable=SC2034  # the variables are the sourcing test's
install_test_arguments() {
  local name=$1
  shift
  if [[ $# -ne 2 ]]; then
    echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2
    exit 2
  fi
  build_dir=$(cd "$1" && pwd)
  source_dir=$(cd "$2" && pwd)
  data_dir=${DDP_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
  python=${DDP_PYTHON:-/usr/bin/python3}
  tmp="$build_dir/Testing/Temporary/$name"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { echo "--- $*"; }

# install_package BUILD_DIR PREFIX installs the build into PREFIX and sets config_dir to the
# directory of its ddpConfig.cmake (lib/cmake/ddp, or lib/<multiarch>/cmake/ddp where the build
# was configured for /usr on Debian).
install_package() {
  local build_dir=$1 prefix=$2
  step "install $build_dir into $prefix"
  cmake --install "$build_dir" --prefix "$prefix" >"$prefix.install.log" ||
    { cat "$prefix.install.log"; fail "cmake --install failed"; }
  config_dir=$(dirname "$(find "$prefix" -path '*/cmake/ddp/ddpConfig.cmake' -print -quit)")
}

# build_against_package SOURCE BUILD PREFIX: configures and builds the CMake project SOURCE in
# BUILD against the package in PREFIX, and checks that it found ddp there. With the README's
# commands, as pytorch/examples' C++ READMEs give theirs: no build type (the compiler's default
# flags; GCC compiles the example in 15 CPU seconds instead of Release's 21, and it trains as fast,
# its work being LibTorch's).
build_against_package() {
  local source=$1 build=$2 prefix=$3
  step "build $source against the installed package"
  cmake -S "$source" -B "$build" -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix" >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; fail "configuring $source against the package failed"; }
  local found
  found=$(sed -n 's/^ddp_DIR:PATH=//p' "$build/CMakeCache.txt")
  [[ "$found" == "$config_dir" ]] || fail "$source found ddp in '$found', not in $prefix"
  cmake --build "$build" >"$build.build.log" 2>&1 ||
    { cat "$build.build.log"; fail "building $source against the package failed"; }
}

# unpack_mnist FROM TO NAME...: Fashion-MNIST's NAME.gz files from FROM, unpacked into TO, as
# torch::data::datasets::MNIST reads them (Fashion-MNIST's names are MNIST's).
unpack_mnist() {
  local from=$1 to=$2
  shift 2
  step "unpack Fashion-MNIST's $* into $to (MNIST's names, unpacked)"
  mkdir -p "$to"
  local name
  for name in "$@"; do
    gunzip -c "$from/$name.gz" >"$to/$name" || fail "cannot unpack $from/$name.gz"
  done
}
