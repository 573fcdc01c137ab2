// SPDX-License-Identifier: GPL-2.0
/*
 * vca_dma: driver scaffolding for the PLX PEX87xx DMA engine on a VCA 2 card.
 *
 * It maps the engine's registers, owns a descriptor ring in coherent host
 * memory, submits copies and polls their completion. It is the base of the
 * persistent transport (A-LUT window + DMA bulk + doorbell notify) that the
 * seed measured in pieces. A self-test copies random data between two host
 * buffers and checks every byte, so a figure is never reported for a copy
 * that did not land.
 *
 * plx87xx_dma binds the same functions, so this driver has no device table:
 * bind it on purpose, and only where plx87xx_dma is not loaded:
 *   echo vca_dma > /sys/bus/pci/devices/<bdf>/driver_override
 *   echo <bdf> > /sys/bus/pci/drivers_probe
 */
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/io.h>
#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/random.h>
#include <linux/slab.h>

#include "vca_dma_regs.h"

#define VCA_DMA_RING_LEN	64
#define VCA_DMA_TIMEOUT_US	200000

static unsigned int selftest_bytes = 1 << 20;
module_param(selftest_bytes, uint, 0644);
MODULE_PARM_DESC(selftest_bytes, "bytes copied by a self-test (default 1 MiB)");

struct vca_dma {
	struct pci_dev *pdev;
	void __iomem *regs;
	struct vca_dma_desc *ring;
	dma_addr_t ring_dma;
	unsigned int head;
	struct mutex lock;
	u64 last_selftest_mibps;
	int last_selftest_result;
};

static u32 chan_read(struct vca_dma *d, u32 reg)
{
	return ioread32(d->regs + VCA_DMA_CHAN_BASE + reg);
}

static void chan_write(struct vca_dma *d, u32 reg, u32 val)
{
	iowrite32(val, d->regs + VCA_DMA_CHAN_BASE + reg);
}

static void vca_dma_ring_init(struct vca_dma *d)
{
	memset(d->ring, 0, sizeof(*d->ring) * VCA_DMA_RING_LEN);
	d->head = 0;
	chan_write(d, VCA_DMA_RING_ADDR_LO, lower_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_RING_ADDR_HI, upper_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_RING_SIZE, VCA_DMA_RING_LEN);
	chan_write(d, VCA_DMA_NEXT_DESC_LO, lower_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_INTR, 0);		/* polled: no interrupts */
}

/* Queue one copy and start the engine; returns the descriptor index. */
static int vca_dma_submit(struct vca_dma *d, dma_addr_t src, dma_addr_t dst, u32 len)
{
	struct vca_dma_desc *desc = &d->ring[d->head];
	int idx = d->head;

	if (!len || len > VCA_DMA_DESC_SIZE_MASK)
		return -EINVAL;
	if (le32_to_cpu(READ_ONCE(desc->ctl_size)) & VCA_DMA_DESC_VALID)
		return -EBUSY;
	desc->addr_hi = cpu_to_le32(((upper_32_bits(src) & 0xffff) << 16) | (upper_32_bits(dst) & 0xffff));
	desc->dst_lo = cpu_to_le32(lower_32_bits(dst));
	desc->src_lo = cpu_to_le32(lower_32_bits(src));
	/* VALID last: the engine may fetch the descriptor as soon as it is set. */
	dma_wmb();
	WRITE_ONCE(desc->ctl_size, cpu_to_le32(VCA_DMA_DESC_VALID | len));
	d->head = (d->head + 1) % VCA_DMA_RING_LEN;
	wmb();
	chan_write(d, VCA_DMA_CTRL, VCA_DMA_CTRL_STATUS_W1C | VCA_DMA_CTRL_OFFCHIP_MODE | VCA_DMA_CTRL_START);
	return idx;
}

/* Poll until the engine hands descriptor @idx back (clears VALID). */
static int vca_dma_wait(struct vca_dma *d, int idx)
{
	u32 status;
	int us;

	for (us = 0; us < VCA_DMA_TIMEOUT_US; us++) {
		u32 ctl = le32_to_cpu(READ_ONCE(d->ring[idx].ctl_size));

		if (!(ctl & VCA_DMA_DESC_VALID))
			return (ctl & (VCA_DMA_DESC_SRC_LINK_ERR | VCA_DMA_DESC_DST_LINK_ERR)) ? -EIO : 0;
		status = chan_read(d, VCA_DMA_INTR);
		if (status & (VCA_DMA_INTR_ERROR | VCA_DMA_INTR_INVALID))
			return -EIO;
		udelay(1);
	}
	return -ETIMEDOUT;
}

/* Copy random data between two host buffers through the engine and compare every byte. */
static int vca_dma_selftest(struct vca_dma *d)
{
	struct device *dev = &d->pdev->dev;
	size_t len = selftest_bytes;
	dma_addr_t src_dma, dst_dma;
	void *src, *dst;
	ktime_t t0;
	s64 ns;
	int idx, ret;

	if (!len || len > VCA_DMA_DESC_SIZE_MASK)
		return -EINVAL;
	src = dma_alloc_coherent(dev, len, &src_dma, GFP_KERNEL);
	dst = dma_alloc_coherent(dev, len, &dst_dma, GFP_KERNEL);
	if (!src || !dst) {
		ret = -ENOMEM;
		goto out;
	}
	get_random_bytes(src, len);
	memset(dst, 0, len);

	mutex_lock(&d->lock);
	t0 = ktime_get();
	idx = vca_dma_submit(d, src_dma, dst_dma, len);
	ret = idx < 0 ? idx : vca_dma_wait(d, idx);
	ns = ktime_to_ns(ktime_sub(ktime_get(), t0));
	mutex_unlock(&d->lock);

	if (!ret && memcmp(src, dst, len))
		ret = -EILSEQ;		/* timed, but the data did not land: no figure */
	d->last_selftest_mibps = (!ret && ns > 0) ? div64_u64((u64)len * 1000000000ULL, (u64)ns << 20) : 0;
out:
	if (src)
		dma_free_coherent(dev, len, src, src_dma);
	if (dst)
		dma_free_coherent(dev, len, dst, dst_dma);
	d->last_selftest_result = ret;
	return ret;
}

static ssize_t selftest_store(struct device *dev, struct device_attribute *attr, const char *buf, size_t count)
{
	int ret = vca_dma_selftest(dev_get_drvdata(dev));

	return ret ? ret : count;
}

static ssize_t selftest_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct vca_dma *d = dev_get_drvdata(dev);

	/* Reading reports the last result only; it never starts a transfer. */
	return sysfs_emit(buf, "result=%d mibps=%llu bytes=%u\n", d->last_selftest_result,
			  d->last_selftest_mibps, selftest_bytes);
}
static DEVICE_ATTR(selftest, 0600, selftest_show, selftest_store);

static int vca_dma_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct vca_dma *d;
	int ret;

	d = devm_kzalloc(&pdev->dev, sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
	d->pdev = pdev;
	mutex_init(&d->lock);
	d->last_selftest_result = -ENODATA;

	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(48));
	if (ret)
		return ret;
	d->regs = pcim_iomap(pdev, 0, 0);
	if (!d->regs)
		return -ENOMEM;
	pci_set_master(pdev);
	d->ring = dmam_alloc_coherent(&pdev->dev, sizeof(*d->ring) * VCA_DMA_RING_LEN, &d->ring_dma, GFP_KERNEL);
	if (!d->ring)
		return -ENOMEM;
	pci_set_drvdata(pdev, d);
	vca_dma_ring_init(d);
	ret = device_create_file(&pdev->dev, &dev_attr_selftest);
	if (ret)
		return ret;
	dev_info(&pdev->dev, "vca_dma: ring of %d descriptors at %pad\n", VCA_DMA_RING_LEN, &d->ring_dma);
	return 0;
}

static void vca_dma_remove(struct pci_dev *pdev)
{
	struct vca_dma *d = pci_get_drvdata(pdev);

	device_remove_file(&pdev->dev, &dev_attr_selftest);
	chan_write(d, VCA_DMA_CTRL, VCA_DMA_CTRL_ABORT);
}

static struct pci_driver vca_dma_driver = {
	.name = "vca_dma",
	.id_table = NULL,	/* bound only through driver_override, see above */
	.probe = vca_dma_probe,
	.remove = vca_dma_remove,
};
module_pci_driver(vca_dma_driver);

MODULE_DESCRIPTION("vcafleet: PLX PEX87xx DMA engine scaffolding with a verified self-test");
MODULE_AUTHOR("vcafleet");
MODULE_LICENSE("GPL");
