#!/usr/bin/env bash
# vca_dma in a real kernel (issue 41): boot Debian 12's own kernel (linux-image-amd64) under
# QEMU (TCG: no KVM needed) with QEMU's `edu` PCI device, build modules_c/vca_dma against that
# kernel's headers (linux-headers-amd64; not the running kernel's), and in a busybox initramfs:
# load it, bind it to edu through driver_override, SUBMIT a copy that never completes (edu is no
# PLX engine: its registers read all ones), WAIT on it and unbind meanwhile, so remove() meets a
# wedged engine; then unload. The console log must show the module's own account (bound, the
# abort not completing, bus mastering off with the memory kept, removed), dmatest's PASS, and no
# oops, WARN, BUG or hung task (hung_task_timeout_secs=5, so an unbind that waits on a WAIT
# holding the engine lock shows up; slub_debug=FZPU poisons and checks freed slab objects).
# Debian ships no lockdep, KASAN or DMA_API_DEBUG kernel. The module, the test program and the
# initramfs are cached by content hash under build/dma-kernel; the boot itself always runs.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${VCA_DMA_KERNEL_CACHE:-build/dma-kernel}
# the kernel linux-image-amd64 stands for, not whatever else /usr/src or /boot hold
kver=$(dpkg-query -W -f '${Depends}' linux-image-amd64 2>/dev/null | grep -o 'linux-image-[^ ,]*' | head -1 || true)
kver=${kver#linux-image-}
hdr=/usr/src/linux-headers-$kver
if [ -z "$kver" ] || [ ! -r "/boot/vmlinuz-$kver" ] || [ ! -d "$hdr" ]; then
    echo "no Debian kernel with its headers: apt-get install linux-image-amd64 linux-headers-amd64" >&2
    exit 1
fi
busybox=/bin/busybox       # busybox-static's (it conflicts with the dynamic busybox package)
dpkg-query -W -f '${db:Status-Abbrev}' busybox-static 2>/dev/null | grep -q '^ii' \
    || { echo "no static busybox: apt-get install busybox-static" >&2; exit 1; }
key=$( { echo "$kver"; sha256sum "$busybox" | cut -d' ' -f1;
         find modules_c/vca_dma tests/vca_dma_qemu -type f -print0 | sort -z | xargs -0 sha256sum; } \
       | sha256sum | cut -c1-16)
dir=$CACHE/$key
if [ ! -s "$dir/initramfs.cpio.gz" ]; then
    start=$SECONDS
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/src" "$dir.tmp/root/bin"
    cp -r modules_c/vca_dma/. "$dir.tmp/src/"
    make -s -C "$dir.tmp/src" KDIR="$hdr" modules > "$dir.tmp/build.log" 2>&1 \
        || { cat "$dir.tmp/build.log"; exit 1; }
    gcc -static -O2 -Wall -Werror -pthread -I modules_c/vca_dma/include/uapi \
        -o "$dir.tmp/root/dmatest" tests/vca_dma_qemu/dmatest.c
    cp "$busybox" "$dir.tmp/root/bin/busybox"
    cp tests/vca_dma_qemu/init "$dir.tmp/root/init"
    cp "$dir.tmp/src/vca_dma.ko" "$dir.tmp/root/"
    mkdir -p "$dir.tmp/root/proc" "$dir.tmp/root/sys" "$dir.tmp/root/dev"
    (cd "$dir.tmp/root" && find . | sort | cpio -o -H newc --quiet -R 0:0) | gzip -9n > "$dir.tmp/initramfs.cpio.gz"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +   # older sources' builds
    echo "built vca_dma.ko for $kver and the initramfs: $((SECONDS - start)) s ($dir)"
fi
log=$CACHE/console.log
start=$SECONDS
timeout 300 nice -n 10 qemu-system-x86_64 -machine q35,accel=tcg -cpu max -m 512 -smp 1 \
    -nographic -no-reboot -device edu -kernel "/boot/vmlinuz-$kver" -initrd "$dir/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 slub_debug=FZPU loglevel=7" < /dev/null > "$log" 2>&1 || true
echo "boot, test and power-off of $kver under QEMU/TCG: $((SECONDS - start)) s (log: $log)"
fail=0
for want in 'vca_dma: /dev/vca_dma0, ring of' 'DMATEST submitted' 'abort did not complete: engine disabled' \
            'vca_dma: engine wedged: bus mastering off' 'removed (engine wedged)' 'DMATEST PASS' \
            'DMATEST unloaded' 'DMATEST DONE'; do
    grep -qF -- "$want" "$log" || { echo "missing from the console log: $want" >&2; fail=1; }
done
if grep -nE 'Oops|WARNING:|BUG:|blocked for more than|Call Trace|general protection|Kernel panic|DMATEST FAIL' "$log" >&2; then
    echo "the kernel log has the lines above" >&2
    fail=1
fi
grep -E 'vca_dma|DMATEST' "$log" | sed 's/^/  /'
[ "$fail" = 0 ] || { echo "vca_dma kernel test FAILED (whole log: $log)" >&2; exit 1; }
echo "vca_dma kernel test passed"
