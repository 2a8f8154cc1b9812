#!/usr/bin/env bash
# Builds the GPU tests and examples here (the GPU machine has no Rust) and
# packs them, with what the GPU machine lacks (the Vulkan loader, the Khronos
# validation layer), into .gpu/ and .gl/. Then, on the GPU machine, from the
# repository root:   bash .gpu/bundle/run.sh
#
# The bundle records the commit it was built from (and whether the tree was
# dirty); run.sh prints that first. Test binaries come twice: the stripped
# `gpu` profile, and `gpu-debug` (debug assertions and overflow checks) for
# the fd-heavy tests (wire, vulkan). A compute-sanitizer is packed if one is
# found here ($COMPUTE_SANITIZER_DIR, or /usr/local/cuda/compute-sanitizer);
# otherwise run.sh uses the GPU machine's, and says so if there is none.
# The whole of .gpu/ and .gl/ must stay under 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu/bundle
limit_mib=60
rm -rf "$out" && mkdir -p "$out" .gpu/vvl

# What this bundle is: printed first by run.sh.
commit=$(git rev-parse HEAD)
changes=$(git status --porcelain)
{
  if [ -n "$changes" ]; then
    echo "commit $commit DIRTY (built with the uncommitted changes listed below)"
    printf '%s\n' "$changes" | sed 's/^/    /'
  else
    echo "commit $commit (clean tree)"
  fi
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(rustc --version)"
} > "$out/BUILD"
cat "$out/BUILD"

# Copies the test binaries of cuda-interop-tests built with profile $1 for the
# test targets $3..., as $out/test-<name>$2.
tests() {
  local profile=$1 suffix=$2 args=() json path t
  shift 2
  for t in "$@"; do args+=(--test "$t"); done
  json=$(cargo test --profile "$profile" -p cuda-interop-tests --features device-local "${args[@]}" --no-run --message-format=json)
  for t in "$@"; do
    path=$(printf '%s\n' "$json" | grep -o "\"executable\":\"[^\"]*/deps/$t-[^\"]*\"" | tail -1 | cut -d'"' -f4)
    [ -n "$path" ] || { echo "gpu-bundle: no $profile test binary for $t" >&2; exit 1; }
    cp "$path" "$out/test-$t$suffix"
  done
}

# Test binaries (stripped `gpu` profile), the debug-assertion copies of the
# fd-heavy ones, and the examples.
cargo build --profile gpu -p cuda-interop --examples
cargo build --profile gpu -p cuda-interop-sys --example driver_info
tests gpu "" gpu gpu_faults vulkan wire trust_boundary soak
tests gpu-debug -debug vulkan wire trust_boundary
for e in round_trip host_wait array_copy; do cp "target/gpu/examples/$e" "$out/"; done
cp target/gpu/examples/driver_info "$out/"
# The performance suite (issue 11): run it on its own, without the layer.
cargo build --profile gpu -p cuda-interop-bench
cp target/gpu/bench "$out/"
cp scripts/gpu-run.sh "$out/run.sh"

# compute-sanitizer, if this machine has one to give.
san_dir=${COMPUTE_SANITIZER_DIR:-/usr/local/cuda/compute-sanitizer}
if [ -x "$san_dir/compute-sanitizer" ]; then
  cp -r "$san_dir" .gpu/compute-sanitizer
  echo "packed compute-sanitizer from $san_dir"
else
  echo "no compute-sanitizer here ($san_dir): run.sh will use the GPU machine's"
fi

# Debian's loader packages (the device README's recipe) and validation layer.
if ! ls .gl/*.deb >/dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
if [ ! -f .gpu/vvl/libVkLayer_khronos_validation.so ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download vulkan-validationlayers >/dev/null && dpkg -x vulkan-validationlayers_*.deb x)
  so=$(find "$tmp/x" -name 'libVkLayer_khronos_validation.so' | head -1)
  js=$(find "$tmp/x" -name 'VkLayer_khronos_validation.json' | head -1)
  cp "$so" .gpu/vvl/
  strip --strip-debug .gpu/vvl/libVkLayer_khronos_validation.so || true
  sed 's#"library_path": *"[^"]*"#"library_path": "./libVkLayer_khronos_validation.so"#' "$js" > .gpu/vvl/VkLayer_khronos_validation.json
  rm -rf "$tmp"
fi
du -sh "$out"/* .gpu/vvl .gl | sort -h
total=$(du -sk .gpu .gl | awk '{ k += $1 } END { print int((k + 1023) / 1024) }')
echo "bundle: ${total} MiB in .gpu and .gl (limit ${limit_mib} MiB)"
if [ "$total" -gt "$limit_mib" ]; then
  echo "gpu-bundle: the bundle is over ${limit_mib} MiB" >&2
  exit 1
fi
echo "carry: .gl .gpu   command: bash .gpu/bundle/run.sh"
