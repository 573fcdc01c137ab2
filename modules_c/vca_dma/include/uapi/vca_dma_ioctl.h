/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * vca_dma: the user ABI of /dev/vca_dma<N>, one character device per PLX DMA engine.
 *
 * Versioning. Every struct starts with a __u32 size: the caller sets it to
 * sizeof() of the struct as it was compiled. The driver dispatches on the
 * ioctl's type and number only, reads `size` first, and copies the struct with
 * copy_struct_from_user() semantics:
 *   - size smaller than the struct's first version (VCA_DMA_*_SIZE_V1): -EINVAL;
 *   - size larger than the driver's struct: the bytes the driver does not know
 *     must be zero, else -E2BIG;
 *   - fields the caller did not send read as zero.
 * On the way out the driver writes back at most `size` bytes. New fields are
 * only ever appended, and zero means "as in version 1". The ABI version is in
 * struct vca_dma_info; a driver answers VCA_DMA_IOC_INFO whatever the version.
 *
 * Safety. The driver DMA-maps only buffers it allocated itself or pinned from
 * the caller for the length of one copy (pin_user_pages), and A-LUT windows
 * it was given by module parameter, each of which must lie inside a memory
 * BAR of a PLX function (dma_map_resource). open(), SUBMIT and DOORBELL need
 * CAP_SYS_RAWIO (-EPERM): a descriptor handed to a process without it moves
 * nothing. It refuses to bind a function that plx87xx_dma owns. It never
 * touches plx87xx's debugfs files.
 */
#ifndef VCAFLEET_VCA_DMA_IOCTL_H
#define VCAFLEET_VCA_DMA_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define VCA_DMA_ABI_VERSION	2	/* 2: WAIT reports start_real_ns and done_real_ns */
#define VCA_DMA_MAGIC		'V'	/* vca_mbox uses 'v' */

/* VCA_DMA_IOC_INFO: what this engine is and what it can do. */
struct vca_dma_info {
	__u32 size;
	__u32 abi_version;		/* out: VCA_DMA_ABI_VERSION */
	__u32 engine;			/* out: N of /dev/vca_dma<N> */
	__u32 ring_len;			/* out: descriptors in the ring */
	__u64 max_copy_bytes;		/* out: the longest copy one submit takes */
	__u32 n_windows;		/* out: A-LUT windows this engine may target */
	__u32 flags;			/* out: VCA_DMA_INFO_* */
	char bdf[16];			/* out: PCI address of the DMA function, NUL-terminated */
};
#define VCA_DMA_INFO_SIZE_V1	48
#define VCA_DMA_INFO_FAULT_ARMED	(1U << 0)	/* never set now: the test-only fault= parameter is gone */

/* VCA_DMA_IOC_WINDOW: one A-LUT window onto a peer (host memory or another node). */
struct vca_dma_window {
	__u32 size;
	__u32 index;			/* in: 0 .. n_windows-1 */
	__s32 peer;			/* out: VCA_DMA_PEER_HOST, or the peer node's index on the card */
	__u32 flags;			/* out: reserved, 0 */
	__u64 bus_addr;			/* out: the window's base as the engine addresses it */
	__u64 length;			/* out: bytes */
};
#define VCA_DMA_WINDOW_SIZE_V1	32
#define VCA_DMA_PEER_HOST	(-1)

/*
 * VCA_DMA_IOC_SUBMIT: one copy between a user buffer (pinned by the driver
 * until the copy is waited for) and a target:
 *   VCA_DMA_TARGET_USER:   a second user buffer of this process (host to host:
 *                          the engine's self-test path);
 *   VCA_DMA_TARGET_WINDOW: target_offset bytes into A-LUT window target_index.
 * VCA_DMA_DIR_TO_TARGET copies the user buffer to the target, FROM_TARGET the
 * other way. length must be a multiple of 4 and at most max_copy_bytes.
 */
struct vca_dma_copy {
	__u32 size;
	__u32 flags;			/* in: one VCA_DMA_DIR_* */
	__u64 user_addr;		/* in: the caller's buffer */
	__u64 length;			/* in: bytes */
	__u32 target_kind;		/* in: VCA_DMA_TARGET_* */
	__u32 target_index;		/* in: the window (TARGET_WINDOW), else 0 */
	__u64 target_offset;		/* in: offset in the window, or the second buffer's address (TARGET_USER) */
	__u64 cookie;			/* out: what VCA_DMA_IOC_WAIT waits for */
};
#define VCA_DMA_COPY_SIZE_V1	48
#define VCA_DMA_DIR_TO_TARGET	(1U << 0)
#define VCA_DMA_DIR_FROM_TARGET	(1U << 1)
#define VCA_DMA_TARGET_USER	1
#define VCA_DMA_TARGET_WINDOW	2

/*
 * VCA_DMA_IOC_WAIT: block until a submitted copy completes, fails, or
 * timeout_ms passes; a signal ends it with -EINTR (the copy stays in flight).
 * timeout_ms above VCA_DMA_WAIT_MAX_MS is -EINVAL.
 * The engine lock is not held while it sleeps: another file's SUBMIT gets
 * -EBUSY meanwhile, and the copy's owner closing or the engine going away
 * ends the WAIT (-ENOENT, -ENODEV).
 */
struct vca_dma_wait {
	__u32 size;
	__u32 timeout_ms;		/* in: 0 = do not wait, report only */
	__u64 cookie;			/* in: from VCA_DMA_IOC_SUBMIT */
	__s32 status;			/* out: 0, -EINPROGRESS (timeout_ms passed), -EIO (engine error) */
	__u32 reserved;
	__u64 bytes_done;		/* out: bytes the engine reports transferred */
	__u64 elapsed_ns;		/* out: from the engine's start to its completion */
	/* version 2: CLOCK_REALTIME, as the driver saw them; 0 from a version 1 driver */
	__u64 start_real_ns;		/* out: when the driver started the engine on this copy */
	__u64 done_real_ns;		/* out: the first poll that saw it done; 0: not done */
};
#define VCA_DMA_WAIT_SIZE_V1	40
#define VCA_DMA_WAIT_SIZE_V2	56
#define VCA_DMA_WAIT_MAX_MS	60000

/* VCA_DMA_IOC_COUNTERS: since the driver bound the engine. */
struct vca_dma_counters {
	__u32 size;
	__u32 reserved;
	__u64 submitted;
	__u64 completed;
	__u64 bytes;			/* bytes of completed copies */
	__u64 errors;			/* copies the engine failed */
	__u64 timeouts;			/* waits that gave up (the copy was then aborted) */
	__u64 doorbells;
};
#define VCA_DMA_COUNTERS_SIZE_V1	56

/*
 * VCA_DMA_IOC_DOORBELL: post a word and ring a doorbell through vca_mbox's
 * plx_mbox API. -EINVAL for a device outside 0..15, a value of 0 or a
 * non-zero reserved; -ENODEV once the engine is gone.
 */
struct vca_dma_doorbell {
	__u32 size;
	__s32 device;			/* in: plx87xx device index (the node), 0..15 */
	__u32 value;			/* in: the word posted to the scratchpad before the bell */
	__u32 reserved;			/* in: 0 */
};
#define VCA_DMA_DOORBELL_SIZE_V1	16

#define VCA_DMA_IOC_INFO	_IOWR(VCA_DMA_MAGIC, 1, struct vca_dma_info)
#define VCA_DMA_IOC_WINDOW	_IOWR(VCA_DMA_MAGIC, 2, struct vca_dma_window)
#define VCA_DMA_IOC_SUBMIT	_IOWR(VCA_DMA_MAGIC, 3, struct vca_dma_copy)
#define VCA_DMA_IOC_WAIT	_IOWR(VCA_DMA_MAGIC, 4, struct vca_dma_wait)
#define VCA_DMA_IOC_COUNTERS	_IOWR(VCA_DMA_MAGIC, 5, struct vca_dma_counters)
#define VCA_DMA_IOC_DOORBELL	_IOW(VCA_DMA_MAGIC, 6, struct vca_dma_doorbell)

#endif
