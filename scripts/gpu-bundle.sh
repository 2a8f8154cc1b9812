#!/usr/bin/env bash
# Builds the GPU tests and examples here (the GPU machine has no Rust) and
# packs them, with what the GPU machine lacks (the Vulkan loader, the Khronos
# validation layer), into .gpu/ and .gl/. Then, on the GPU machine, from the
# repository root:   bash .gpu/bundle/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu/bundle
rm -rf "$out" && mkdir -p "$out" .gpu/vvl

# Test binaries (stripped `gpu` profile) and examples.
cargo build --profile gpu -p cuda-interop --examples
cargo build --profile gpu -p cuda-interop-sys --example driver_info
json=$(cargo test --profile gpu -p cuda-interop-tests --test gpu --test vulkan --no-run --message-format=json 2>/dev/null)
for t in gpu vulkan; do
  path=$(printf '%s\n' "$json" | grep -o "\"executable\":\"[^\"]*/deps/$t-[^\"]*\"" | tail -1 | cut -d'"' -f4)
  cp "$path" "$out/test-$t"
done
for e in round_trip host_wait; do cp "target/gpu/examples/$e" "$out/"; done
cp target/gpu/examples/driver_info "$out/"
cp scripts/gpu-run.sh "$out/run.sh"

# Debian's loader packages (the device README's recipe) and validation layer.
if ! ls .gl/*.deb >/dev/null 2>&1; then
  grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo /.gl/ >> .git/info/exclude
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
du -sh .gpu .gl
echo "carry: .gl .gpu   command: bash .gpu/bundle/run.sh"
