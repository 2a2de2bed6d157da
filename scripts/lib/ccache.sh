# shellcheck shell=bash
# Debian's ccache for the builds of a test run (CI's, and anyone's who sets DDP_CCACHE_ROOT): the
# Release build, the sanitizer, fuzz and clang builds, and the builds the tests make (the installed
# package's example, the compile-fail checks), through CMake's CMAKE_<LANG>_COMPILER_LAUNCHER,
# which cmake reads from the environment when it configures a build directory for the first time.
# Sourced by scripts/test.sh and scripts/sanitize.sh.
#
#   ddp_ccache_setup ROOT   ROOT: the source tree. Without DDP_CCACHE_ROOT set, or without ccache
#                           installed, does nothing. Else the cache is DDP_CCACHE_ROOT/<codename>
#                           (one per Debian release: their compilers differ, and so do their
#                           ccache versions)
#   ddp_ccache_counts       "<hits> <misses> <uncacheable>" since the cache was made; stage()
#                           prints the difference over a stage
#
# What a hit needs, and why each setting is safe. ccache hashes the compiler (its size and mtime),
# every argument, the source and every header it reads, by content; a change to any of them is a
# miss, and the compiler runs. Fresh clones sit in a new directory each run, so paths are made
# relative to the tree: base_dir rewrites the arguments; -ffile-prefix-map rewrites what the
# compiler itself writes of a path (__FILE__, as in every gtest assertion and check macro, and the
# debug info), which matters for the unity batches, whose generated sources #include each file by
# its absolute path; hash_dir off, as the working directory's path is then in no output. The
# sloppiness is what the precompiled header needs (ccache's manual, "Precompiled headers"): no
# source here uses __DATE__ or __TIME__, and a header made during the build (the PCH, version.h) is
# hashed by content like any other.

ddp_ccache_setup() {
  local root="$1"
  [[ -n "${DDP_CCACHE_ROOT:-}" ]] || return 0
  if ! command -v ccache >/dev/null; then
    echo "ccache: not installed; building without a cache" >&2
    return 0
  fi
  local codename
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")"
  export CCACHE_DIR="$DDP_CCACHE_ROOT/$codename"
  export CCACHE_BASEDIR="$root"
  export CCACHE_NOHASHDIR=1
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-4G}"
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  case " ${CXXFLAGS:-} " in
    *" -ffile-prefix-map=$root=. "*) ;;
    *) export CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }-ffile-prefix-map=$root=."
       export CFLAGS="${CFLAGS:+$CFLAGS }-ffile-prefix-map=$root=." ;;
  esac
  mkdir -p "$CCACHE_DIR"
  echo "ccache: $(ccache --version | head -1), cache $CCACHE_DIR ($(ccache_size))"
}

ccache_size() {
  ccache --print-stats | awk -F'\t' '$1 == "cache_size_kibibyte" {printf "%.0f MiB", $2 / 1024}'
}

ddp_ccache_counts() {
  ccache --print-stats | awk -F'\t' '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" {hits += $2}
    $1 == "cache_miss" {misses += $2}
    $1 == "could_not_use_precompiled_header" || $1 == "preprocessor_error" ||
      $1 == "unsupported_compiler_option" || $1 == "unsupported_source_language" {other += $2}
    END {print hits + 0, misses + 0, other + 0}'
}
