/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Register map of the PLX PEX87xx DMA engine, as the two public drivers of it
 * program it: Intel's plx87xx_dma (VCA 2.3.26, modules/vca/plx87xx_dma/plx_dma.h
 * in chainsx/intel-vca2-dkms) and Linux's drivers/dma/plx_dma.c. BAR 0 of the
 * DMA function, one channel at 0x200, a ring of 16-byte descriptors in host
 * memory. docs/DMA.md names the reference line behind every register write.
 */
#ifndef VCAFLEET_VCA_DMA_REGS_H
#define VCAFLEET_VCA_DMA_REGS_H

#include <linux/bits.h>
#include <linux/types.h>

#define VCA_DMA_CHAN_BASE		0x200

/* Channel registers, relative to VCA_DMA_CHAN_BASE */
#define VCA_DMA_RING_ADDR_LO		0x14
#define VCA_DMA_RING_ADDR_HI		0x18
#define VCA_DMA_NEXT_DESC_LO		0x1C
#define VCA_DMA_RING_SIZE		0x20	/* in descriptors */
#define VCA_DMA_LAST_DESC_LO		0x24
#define VCA_DMA_LAST_XFER_SIZE		0x28
#define VCA_DMA_MAX_PREFETCH		0x34
#define VCA_DMA_CTRL			0x38
#define VCA_DMA_INTR			0x3C

/* VCA_DMA_CTRL */
#define VCA_DMA_CTRL_PAUSE		BIT(0)
#define VCA_DMA_CTRL_ABORT		BIT(1)
#define VCA_DMA_CTRL_WB_ENABLE		BIT(2)
#define VCA_DMA_CTRL_START		BIT(3)
#define VCA_DMA_CTRL_RING_STOP		BIT(4)
#define VCA_DMA_CTRL_OFFCHIP_MODE	(2U << 5)	/* descriptors in host memory */
#define VCA_DMA_CTRL_DESC_INVALID	BIT(8)
#define VCA_DMA_CTRL_PAUSE_DONE		BIT(9)
#define VCA_DMA_CTRL_ABORT_DONE		BIT(10)
#define VCA_DMA_CTRL_IMM_PAUSE_DONE	BIT(12)
#define VCA_DMA_CTRL_IN_PROGRESS	BIT(30)
#define VCA_DMA_CTRL_HEADER_LOG		BIT(31)
/* status bits, write 1 to clear (plx_dma.h PLX_DMA_CTRL_HEADER_LOG | PLX_DMA_CTRL_STATUS_BITS) */
#define VCA_DMA_CTRL_STATUS_W1C		(VCA_DMA_CTRL_HEADER_LOG | (0x17U << 8))
#define VCA_DMA_CTRL_MODE_MASK		(3U << 5)
/* configuration the firmware set: max transfer size, relaxed ordering, TC (plx_dma.c:185-186) */
#define VCA_DMA_CTRL_CFG_MASK		0x3FFFE000U

/* VCA_DMA_INTR */
#define VCA_DMA_INTR_ERROR_EN		BIT(0)
#define VCA_DMA_INTR_INVALID_EN		BIT(1)
#define VCA_DMA_INTR_ABORT_DONE_EN	BIT(3)
#define VCA_DMA_INTR_ERROR		BIT(16)
#define VCA_DMA_INTR_INVALID		BIT(17)
#define VCA_DMA_INTR_DESC_DONE		BIT(18)
#define VCA_DMA_INTR_ENABLE_MASK	0x0000FFFFU
#define VCA_DMA_INTR_STATUS_MASK	0xFFFF0000U	/* write 1 to clear */

/*
 * Descriptor, "standard" format. With write-back enabled the engine rewrites
 * ctl_size when it is done: VALID cleared, WB_SUCCESS or a failure bit, and
 * the size field holding the bytes it moved (Linux plx_dma_process_desc()).
 */
struct vca_dma_desc {
	__le32 ctl_size;	/* VALID | INTR | size[26:0] */
	__le32 addr_hi;		/* src[47:32] << 16 | dst[47:32] */
	__le32 dst_lo;
	__le32 src_lo;
} __packed;

#define VCA_DMA_DESC_VALID		BIT(31)
#define VCA_DMA_DESC_INTR		BIT(30)
#define VCA_DMA_DESC_WB_SUCCESS		BIT(30)	/* in a written-back descriptor */
#define VCA_DMA_DESC_SRC_LINK_ERR	BIT(29)	/* the read failed */
#define VCA_DMA_DESC_DST_LINK_ERR	BIT(28)	/* the write failed */
#define VCA_DMA_DESC_SIZE_MASK		(BIT(27) - 1)

#endif
