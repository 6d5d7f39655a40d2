#!/bin/bash
# Slims the BCC bundle made by shared/device/make-bcc-bundle.sh so that it and the project's tree fit
# the GPU host's 64 MiB transfer limit (the bundle alone is ~60 MB). Removes what compiling and loading
# our BPF programs never reads: kernel headers of other architectures and of subsystems (device tree,
# sound, DRM, media, ...), two unused libraries (ICU i18n, tic), and replaces ICU's 31 MB data library
# with a stub that only defines its symbol (LLVM links libxml2, which links ICU; BPF compilation never
# converts text encodings). Checked: the collector compiles and attaches with the slim tree.
#   bench/gpu/slim-bcc-bundle.sh IN.tar.xz OUT.tar.xz
set -euo pipefail
in=${1:?usage: slim-bcc-bundle.sh IN.tar.xz OUT.tar.xz}; out=${2:?usage: slim-bcc-bundle.sh IN.tar.xz OUT.tar.xz}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -C "$work" -xJf "$in"
common=$(ls -d "$work"/usr/src/linux-headers-*-common)
for d in "$common"/arch/*; do [ "$(basename "$d")" = x86 ] || rm -rf "$d"; done
for d in dt-bindings sound drm media video xen soc rdma acpi crypto keys kunit pcmcia scsi target ras math-emu misc trace kvm ufs rv memory; do
  rm -rf "$common/include/$d"
done
lib="$work/usr/lib/x86_64-linux-gnu"
rm -f "$lib"/libicui18n.so* "$lib"/libtic.so*
data=$(ls "$lib"/libicudata.so.*.* | head -1)
ver=$(basename "$data" | sed 's/libicudata.so.\([0-9]*\).*/\1/')
printf 'const unsigned char icudt%s_dat[4096] __attribute__((aligned(16))) = {0};\n' "$ver" > "$work/icustub.c"
gcc -shared -fPIC -O2 -Wl,-soname,"libicudata.so.$ver" -o "$data" "$work/icustub.c"
rm -f "$work/icustub.c"
tar -C "$work" -cf - . | xz -T0 -9e > "$out"
ls -la "$out"
